"""Extension points for metrics, traces, logs and diagnostics: a typed class of no-op methods.

Subclass :class:`Hooks`, override what you need and pass an instance to ``App(hooks=...)``;
:class:`HookChain` runs several. Hooks run on the caller's thread (a producer's, or a worker's
handler, acker or heartbeat thread); keep them fast and never raise from them.

Where each is called::

    enqueue        enqueuing(specs) ─► [store] ─► job_enqueued(job) for each job
    handler thread delivering(delivery) ─┬─ running_step(delivery, name) / step_skipped(...)
                                         └─ attempt_ended(event) unless the finish is pending
    acker thread   attempt_ended(event) once the batched finish is written or refused
    heartbeat      leases_renewed(count) after each beat; lease_lost(delivery, reason)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from jobguard.models import Delivery, Job, JobSpec, Outcome


@dataclass(frozen=True, slots=True)
class AttemptEvent:
    """How one delivery ended, with the attempt log's fields (what was written, or refused).

    ``reason`` is the pipeline's short explanation (why it was retried, buried, deferred or
    refused); ``error_type`` and ``error_message`` are the handler's error, if it raised.
    """

    delivery: Delivery
    worker_id: str
    outcome: Outcome
    duration_s: float
    lock_owner: str | None = None
    fence: int | None = None
    steps_run: int = 0
    steps_skipped: int = 0
    reason: str = ""
    error_type: str | None = None
    error_message: str | None = None


class Hooks:
    """No-op base; every method is called directly by the app, the worker or the pipeline."""

    def worker_started(self, worker_id: str, queues: list[str]) -> None:
        """The worker started fetching."""

    def worker_stopped(self, worker_id: str, released: int) -> None:
        """The worker stopped; ``released`` leases were handed back uncharged."""

    def enqueuing(
        self, specs: Sequence[JobSpec]
    ) -> contextlib.AbstractContextManager[dict[str, str]]:
        """Wraps storing new jobs; the headers it yields are stored on each job.

        A tracer yields its trace context here (``traceparent``), so the job's deliveries join
        the producer's trace. The default yields no header.
        """
        return contextlib.nullcontext({})

    def job_enqueued(self, job: Job) -> None:
        """A job was stored, or ``job.deduplicated``: an existing job holds its dedup key."""

    def delivering(self, delivery: Delivery) -> contextlib.AbstractContextManager[None]:
        """Wraps the pipeline's run of one delivery on its handler thread (handler included).

        The delivery's :meth:`attempt_ended` comes inside it, or later from the acker thread
        when its finish is written in a batch.
        """
        return contextlib.nullcontext()

    def running_step(
        self, delivery: Delivery, name: str
    ) -> contextlib.AbstractContextManager[None]:
        """Wraps a ``ctx.step()`` or ``ctx.db_step()`` that runs (it was not done before)."""
        return contextlib.nullcontext()

    def step_skipped(self, delivery: Delivery, name: str) -> None:
        """A step was already done for this operation: its stored result was returned."""

    def attempt_ended(self, event: AttemptEvent) -> None:
        """A delivery ended; the attempt log holds the same facts (or will, for ``lost``)."""

    def delivery_settled(self, delivery: Delivery, outcome: Outcome, duration_s: float) -> None:
        """A delivery ended (including refused writes of a stale delivery).

        The same moment as :meth:`attempt_ended`, with fewer facts.
        """

    def leases_renewed(self, count: int) -> None:
        """The heartbeat extended ``count`` leases (and their locks) in one beat."""

    def lease_lost(self, delivery: Delivery, reason: str) -> None:
        """The heartbeat found a lease or lock no longer ours."""

    def worker_failed(self, worker_id: str, reason: str) -> None:
        """The worker stopped taking work because a part it relies on failed (the heartbeat)."""

    def store_error(self, where: str, error: BaseException) -> None:
        """A store call failed (the worker keeps going and retries)."""


class HookChain(Hooks):
    """Several hooks in order, e.g. ``App(hooks=HookChain(metrics, tracing))``."""

    def __init__(self, *hooks: Hooks) -> None:
        self.hooks = tuple(hooks)

    def worker_started(self, worker_id: str, queues: list[str]) -> None:
        """Call every hook."""
        for hook in self.hooks:
            hook.worker_started(worker_id, queues)

    def worker_stopped(self, worker_id: str, released: int) -> None:
        """Call every hook."""
        for hook in self.hooks:
            hook.worker_stopped(worker_id, released)

    @contextlib.contextmanager
    def enqueuing(self, specs: Sequence[JobSpec]) -> Iterator[dict[str, str]]:
        """Enter every hook in order; the headers they yield are merged (later ones win)."""
        headers: dict[str, str] = {}
        with contextlib.ExitStack() as stack:
            for hook in self.hooks:
                headers.update(stack.enter_context(hook.enqueuing(specs)))
            yield headers

    def job_enqueued(self, job: Job) -> None:
        """Call every hook."""
        for hook in self.hooks:
            hook.job_enqueued(job)

    @contextlib.contextmanager
    def delivering(self, delivery: Delivery) -> Iterator[None]:
        """Enter every hook in order."""
        with contextlib.ExitStack() as stack:
            for hook in self.hooks:
                stack.enter_context(hook.delivering(delivery))
            yield

    @contextlib.contextmanager
    def running_step(self, delivery: Delivery, name: str) -> Iterator[None]:
        """Enter every hook in order."""
        with contextlib.ExitStack() as stack:
            for hook in self.hooks:
                stack.enter_context(hook.running_step(delivery, name))
            yield

    def step_skipped(self, delivery: Delivery, name: str) -> None:
        """Call every hook."""
        for hook in self.hooks:
            hook.step_skipped(delivery, name)

    def attempt_ended(self, event: AttemptEvent) -> None:
        """Call every hook."""
        for hook in self.hooks:
            hook.attempt_ended(event)

    def delivery_settled(self, delivery: Delivery, outcome: Outcome, duration_s: float) -> None:
        """Call every hook."""
        for hook in self.hooks:
            hook.delivery_settled(delivery, outcome, duration_s)

    def leases_renewed(self, count: int) -> None:
        """Call every hook."""
        for hook in self.hooks:
            hook.leases_renewed(count)

    def lease_lost(self, delivery: Delivery, reason: str) -> None:
        """Call every hook."""
        for hook in self.hooks:
            hook.lease_lost(delivery, reason)

    def worker_failed(self, worker_id: str, reason: str) -> None:
        """Call every hook."""
        for hook in self.hooks:
            hook.worker_failed(worker_id, reason)

    def store_error(self, where: str, error: BaseException) -> None:
        """Call every hook."""
        for hook in self.hooks:
            hook.store_error(where, error)
