"""OpenTelemetry traces: the enqueue, every delivery and every step, in the producer's trace.

Only the OpenTelemetry API is used: without an SDK configured the spans cost next to nothing
and go nowhere; with one (the application's choice of SDK, sampler and exporter) they join the
traces the application already makes.

* ``jobguard enqueue TASK`` (producer) wraps storing a job; its context is stored on the job as
  the ``traceparent`` header, so a web request that enqueues is the parent of all that follows.
* ``jobguard run TASK`` (consumer), one per delivery, a child of that context, with the attempt's
  facts: ``jobguard.job_id``, ``jobguard.attempt``, ``jobguard.operation_key``,
  ``jobguard.lease_token``, ``jobguard.fence``, ``jobguard.lock_owner`` and
  ``jobguard.outcome``; any span the handler starts is its child.
* ``jobguard step NAME``, one per ``ctx.step()``/``ctx.db_step()``; a step done by an earlier
  attempt appears as a zero-length span with ``jobguard.step.skipped = true``.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from opentelemetry import propagate, trace
from opentelemetry.context import Context as OtelContext
from opentelemetry.trace import SpanKind, Status, StatusCode

from jobguard.hooks import AttemptEvent, Hooks
from jobguard.models import UNSUCCESSFUL_OUTCOMES, Delivery, Job, JobSpec

if TYPE_CHECKING:
    from opentelemetry.trace import Span, TracerProvider

# Outcomes whose span is marked as an error: the delivery did not do its work.
_FAILED = UNSUCCESSFUL_OUTCOMES
MAX_OPEN_SPANS = 100_000  # deliveries whose finish is pending; a bound against a leak


def delivery_attributes(delivery: Delivery) -> dict[str, Any]:
    """The span attributes of a delivery known when it starts (no ``None`` values)."""
    attributes: dict[str, Any] = {
        "messaging.system": "jobguard",
        "messaging.destination.name": delivery.queue,
        "jobguard.task": delivery.task,
        "jobguard.job_id": delivery.job_id,
        "jobguard.attempt": delivery.attempt,
        "jobguard.max_attempts": delivery.max_attempts,
        "jobguard.lease_token": delivery.lease_token,
    }
    if delivery.operation_key is not None:
        attributes["jobguard.operation_key"] = delivery.operation_key
    if delivery.resource_key is not None:
        attributes["jobguard.resource_key"] = delivery.resource_key
    return attributes


def parent_context(headers: str | None) -> OtelContext:
    """The trace context a job carries in its headers (JSON object text).

    Headers that are missing, not JSON or not an object of strings give an empty context: a
    stored row is input too, and a bad one must not stop the delivery.
    """
    if not headers:
        return OtelContext()  # the common case without a tracer at the producer: nothing to parse
    try:
        found = json.loads(headers)
    except ValueError:
        return OtelContext()
    if not isinstance(found, dict):
        return OtelContext()
    carrier = {k: v for k, v in found.items() if isinstance(k, str) and isinstance(v, str)}
    return propagate.extract(carrier)


class TracingHooks(Hooks):
    """Spans for enqueues, deliveries and steps through the OpenTelemetry API.

    Args:
        tracer_provider: Where spans go (default: the global provider the application set).
    """

    def __init__(self, tracer_provider: TracerProvider | None = None) -> None:
        from jobguard import __version__

        self.tracer = trace.get_tracer("jobguard", __version__, tracer_provider=tracer_provider)
        self._open: dict[str, Span] = {}
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def enqueuing(self, specs: Sequence[JobSpec]) -> Iterator[dict[str, str]]:
        """A producer span around the store write; its context is yielded as headers."""
        tasks = sorted({spec.task for spec in specs})
        name = f"jobguard enqueue {tasks[0]}" if len(tasks) == 1 else "jobguard enqueue"
        attributes: dict[str, Any] = {"messaging.system": "jobguard", "jobguard.jobs": len(specs)}
        with self.tracer.start_as_current_span(name, kind=SpanKind.PRODUCER, attributes=attributes):
            carrier: dict[str, str] = {}
            propagate.inject(carrier)
            yield carrier

    def job_enqueued(self, job: Job) -> None:
        """Note the stored job (or the dedup hit) on the enqueue span."""
        span = trace.get_current_span()
        span.set_attribute("jobguard.job_id", job.id)
        span.set_attribute("jobguard.deduplicated", job.deduplicated)

    @contextlib.contextmanager
    def delivering(self, delivery: Delivery) -> Iterator[None]:
        """Start the delivery's span and make it current while the handler runs.

        The span ends at :meth:`attempt_ended`, which comes later from the settler thread.
        """
        span = self.tracer.start_span(
            f"jobguard run {delivery.task}",
            context=parent_context(delivery.headers),
            kind=SpanKind.CONSUMER,
            attributes=delivery_attributes(delivery),
        )
        if span.is_recording():  # a sampled-out or no-op span needs no ending facts
            with self._lock:
                if len(self._open) < MAX_OPEN_SPANS:
                    self._open[delivery.lease_token] = span
        try:
            with trace.use_span(span, end_on_exit=False, record_exception=False):
                yield
        except BaseException as exc:
            ended = self._pop(delivery.lease_token)
            if ended is not None:
                ended.record_exception(exc)
                ended.set_status(Status(StatusCode.ERROR, type(exc).__name__))
                ended.end()
            raise

    def _pop(self, lease_token: str) -> Span | None:
        with self._lock:
            return self._open.pop(lease_token, None)

    @contextlib.contextmanager
    def running_step(self, delivery: Delivery, name: str) -> Iterator[None]:
        """A child span of the delivery's for one step that runs."""
        with self.tracer.start_as_current_span(
            f"jobguard step {name}", attributes={"jobguard.step": name}
        ):
            yield

    def step_skipped(self, delivery: Delivery, name: str) -> None:
        """A zero-length child span for a step an earlier attempt did."""
        span = self.tracer.start_span(
            f"jobguard step {name}",
            attributes={"jobguard.step": name, "jobguard.step.skipped": True},
        )
        span.end()

    def attempt_ended(self, event: AttemptEvent) -> None:
        """Put the outcome and the lock's facts on the delivery's span and end it."""
        span = self._pop(event.delivery.lease_token)
        if span is None:
            return
        facts: dict[str, Any] = {
            "jobguard.outcome": event.outcome.value,
            "jobguard.worker_id": event.worker_id,
            "jobguard.steps_run": event.steps_run,
            "jobguard.steps_skipped": event.steps_skipped,
        }
        if event.fence is not None:
            facts["jobguard.fence"] = event.fence
        if event.lock_owner is not None:
            facts["jobguard.lock_owner"] = event.lock_owner
        span.set_attributes(facts)
        if event.error_type is not None:
            span.add_event(
                "exception",
                {
                    "exception.type": event.error_type,
                    "exception.message": event.error_message or "",
                },
            )
        if event.outcome in _FAILED:
            span.set_status(Status(StatusCode.ERROR, f"{event.outcome.value}: {event.reason}"))
        span.end()
