"""Extension points for metrics, traces, logs and diagnostics: a typed class of no-op methods.

Subclass :class:`Hooks`, override what you need and pass an instance to ``App(hooks=...)``;
:class:`HookChain` runs several. Hooks run on the caller's thread (a producer's, or a worker's
handler, settler or heartbeat thread); keep them fast. A hook that raises is contained (logged
once, counted in :attr:`HookChain.failures`), never passed on to the code that called it.

Where each is called::

    enqueue        enqueuing(specs) ─► [store] ─► job_enqueued(job) for each job
    handler thread delivering(delivery) ─► running_step(delivery, name) / step_skipped(...)
    settler thread attempt_ended(event), delivery_settled(...) once the delivery's ending is
                   written (or refused, or could not be written)
    heartbeat      leases_renewed(count) after each beat; lease_lost(delivery, reason)
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from jobguard.models import Delivery, Job, JobSpec, Outcome

log = logging.getLogger("jobguard.hooks")


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

        The delivery's :meth:`attempt_ended` comes later, from the worker's settler thread,
        once its ending is written in a batch.
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

    @property
    def silent(self) -> bool:
        """Whether every method does nothing (these base hooks, unchanged): callers may then
        skip building what they would tell."""
        return type(self) is Hooks


class HookChain(Hooks):
    """Several hooks in order, e.g. ``App(hooks=HookChain(metrics, tracing))``.

    Every call goes through one loop that contains a failing hook: what a hook raises is logged
    (once per hook and method), counted in :attr:`failures`, and never reaches the caller, so a
    broken metrics or tracing hook cannot stop a worker's settler, handler threads or heartbeat.
    The app wraps the hooks it is given in one.
    """

    def __init__(self, *hooks: Hooks) -> None:
        # Hooks that do nothing are left out: with none left, each delivery and step skips
        # the containing loop (the default app's case: a cost per job on the hot path).
        self.hooks = tuple(hook for hook in hooks if not _does_nothing(hook))
        self.failures = 0
        self._told: set[tuple[int, str]] = set()
        self._lock = threading.Lock()

    def _failed(self, hook: Hooks, method: str, exc: BaseException) -> None:
        with self._lock:
            self.failures += 1
            first = (id(hook), method) not in self._told
            self._told.add((id(hook), method))
        if first:
            log.error(
                "hook %s.%s raised; it is skipped and further errors of it are only counted",
                type(hook).__name__,
                method,
                exc_info=exc,
            )

    def _each(self, method: str, *args: Any) -> None:
        """Call ``method`` of every hook in order; contain what each raises."""
        for hook in self.hooks:
            try:
                getattr(hook, method)(*args)
            except Exception as exc:
                self._failed(hook, method, exc)

    @contextlib.contextmanager
    def _around(self, method: str, *args: Any) -> Iterator[list[Any]]:
        """Enter ``method`` of every hook in order (what they yield, in a list); a hook that
        fails to enter or to leave is contained; what the body raises goes on unchanged."""
        entered: list[tuple[Hooks, contextlib.AbstractContextManager[Any]]] = []
        yielded: list[Any] = []
        for hook in self.hooks:
            try:
                manager = getattr(hook, method)(*args)
                yielded.append(manager.__enter__())
            except Exception as exc:
                self._failed(hook, method, exc)
                continue
            entered.append((hook, manager))
        raised: BaseException | None = None
        try:
            yield yielded
        except BaseException as exc:
            raised = exc
        for hook, manager in reversed(entered):
            try:
                if raised is None:
                    manager.__exit__(None, None, None)
                else:
                    manager.__exit__(type(raised), raised, raised.__traceback__)
            except Exception as exc:
                if exc is not raised:
                    self._failed(hook, method, exc)
        if raised is not None:
            raise raised

    def worker_started(self, worker_id: str, queues: list[str]) -> None:
        """Call every hook."""
        self._each("worker_started", worker_id, queues)

    def worker_stopped(self, worker_id: str, released: int) -> None:
        """Call every hook."""
        self._each("worker_stopped", worker_id, released)

    @contextlib.contextmanager
    def enqueuing(self, specs: Sequence[JobSpec]) -> Iterator[dict[str, str]]:
        """Enter every hook in order; the headers they yield are merged (later ones win)."""
        with self._around("enqueuing", specs) as yielded:
            headers: dict[str, str] = {}
            for found in yielded:
                if isinstance(found, dict):
                    headers.update(found)
            yield headers

    def job_enqueued(self, job: Job) -> None:
        """Call every hook."""
        self._each("job_enqueued", job)

    @property
    def silent(self) -> bool:
        """Whether no hook is left to tell."""
        return not self.hooks

    def delivering(self, delivery: Delivery) -> contextlib.AbstractContextManager[None]:
        """Enter every hook in order."""
        return self._entered("delivering", delivery)

    def running_step(
        self, delivery: Delivery, name: str
    ) -> contextlib.AbstractContextManager[None]:
        """Enter every hook in order."""
        return self._entered("running_step", delivery, name)

    def _entered(self, method: str, *args: Any) -> contextlib.AbstractContextManager[None]:
        if not self.hooks:
            return contextlib.nullcontext()
        return self._around_none(method, *args)

    @contextlib.contextmanager
    def _around_none(self, method: str, *args: Any) -> Iterator[None]:
        with self._around(method, *args):
            yield

    def step_skipped(self, delivery: Delivery, name: str) -> None:
        """Call every hook."""
        self._each("step_skipped", delivery, name)

    def attempt_ended(self, event: AttemptEvent) -> None:
        """Call every hook."""
        self._each("attempt_ended", event)

    def delivery_settled(self, delivery: Delivery, outcome: Outcome, duration_s: float) -> None:
        """Call every hook."""
        self._each("delivery_settled", delivery, outcome, duration_s)

    def leases_renewed(self, count: int) -> None:
        """Call every hook."""
        self._each("leases_renewed", count)

    def lease_lost(self, delivery: Delivery, reason: str) -> None:
        """Call every hook."""
        self._each("lease_lost", delivery, reason)

    def worker_failed(self, worker_id: str, reason: str) -> None:
        """Call every hook."""
        self._each("worker_failed", worker_id, reason)

    def store_error(self, where: str, error: BaseException) -> None:
        """Call every hook."""
        self._each("store_error", where, error)


def _does_nothing(hook: Hooks) -> bool:
    """Whether ``hook`` is one of ours and :attr:`~Hooks.silent` (a user's hook, broken or
    not, is not asked anything here)."""
    return type(hook) in (Hooks, HookChain) and hook.silent


def contained(hooks: Hooks) -> HookChain:
    """``hooks`` behind the containing loop of :class:`HookChain` (itself, if it is one)."""
    return hooks if isinstance(hooks, HookChain) else HookChain(hooks)
