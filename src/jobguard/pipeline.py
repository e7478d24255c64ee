"""The guarded execution pipeline, written once for every backend (the article's ``processJob``).

::

    delivery (leased) ─► known task? JSON object? arguments fit? ── no ─► bury
        ─► resource lock, concurrency slot (owner token, fences) ── busy ─► defer (uncharged)
        ─► operation record ── completed ─► "already processed"
        ─► handler(ctx)  (steps memoised, db_step effects in the step's transaction)
        ─► completed: operation completed + job done + attempt closed + lock released
        ─► on error: classify ─► transient: retry with backoff │ fatal/spent/poison: bury
    A write refused for a stale lease or fence ends the delivery as refused: only its own
    attempt row is marked, and the job is left to its current owner (or, when only the lock
    was lost, handed back uncharged).

:meth:`Pipeline.run` decides how a delivery ends and returns it as an
:class:`~jobguard.backends.base.Ending`; it writes no ending itself. The worker's settler
writes endings in batches (:meth:`~jobguard.backends.base.QueuePort.settle`) and tells the
hooks. Until its ending is written a delivery is not over: its lease is held and renewed.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import random
import time
import traceback
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

from jobguard.backends.base import (
    Backend,
    BeginRequest,
    Begun,
    Closing,
    Ending,
    ErrorInfo,
    Prepared,
    begin_request,
)
from jobguard.context import Context, InFlight
from jobguard.core import messages
from jobguard.core.checks import MAX_COUNT
from jobguard.core.jsonvalues import MAX_NESTING, decode_object, too_deep
from jobguard.core.retry import Decision, Verdict, decide, deferral_delay_s, error_signature
from jobguard.core.text import MAX_TRACEBACK_CHARS, describe, storable
from jobguard.exceptions import (
    Fatal,
    GuardLost,
    JobCancelled,
    JobGuardError,
    RunStopped,
    StaleFenceError,
    TimeLimitExceeded,
)
from jobguard.failures import history_for
from jobguard.hooks import AttemptEvent
from jobguard.models import DeadCode, Delivery, Guard, OperationStatus, Outcome

if TYPE_CHECKING:
    from jobguard.hooks import Hooks
    from jobguard.task import Task

RunAsync = Callable[[Coroutine[Any, Any, Any]], Any]


class RunWatch(Protocol):
    """Told when a handler starts and stops running (a process worker's slot reports it to the
    supervisor, which enforces hard time limits from it)."""

    def handler_started(self, inflight: InFlight) -> None:
        """The handler of ``inflight`` is about to be called (its lock, if any, is held)."""

    def handler_ended(self, inflight: InFlight) -> None:
        """The handler of ``inflight`` returned or raised (its ending is not written yet)."""


def guard_of(delivery: Delivery) -> Guard:
    """The guard of a fresh delivery (no lock yet)."""
    return Guard(
        job_id=delivery.job_id, lease_token=delivery.lease_token, attempt_id=delivery.attempt_id
    )


def _hold(inflight: InFlight, begun: Begun, request: BeginRequest) -> None:
    """Carry a lock grant and a slot grant on the delivery, so later writes prove their fences
    and they are renewed."""
    if begun.grant is not None or begun.slot is not None:
        inflight.guard = replace(inflight.guard, lock=begun.grant, slot=begun.slot)
        inflight.lock_ttl_s = request.lock_ttl_s


class Pipeline:
    """Runs one delivery through the guard layers; see the module docstring."""

    def __init__(
        self,
        backend: Backend,
        tasks: Mapping[str, Task],
        worker_id: str,
        hooks: Hooks,
        rng: random.Random | None = None,
        run_async: RunAsync | None = None,
        hard_limits: bool = False,
        watch: RunWatch | None = None,
    ) -> None:
        self.backend = backend
        self.tasks = tasks
        self.worker_id = worker_id
        self.hooks = hooks
        self.rng = rng or random.Random()
        # Where coroutines of async handlers run: the worker's event loop thread.
        self.run_async = run_async
        # Whether the worker running this pipeline stops a run at its hard time limit (process
        # mode does; threads cannot): a job with one is otherwise left for a worker that does.
        self.hard_limits = hard_limits
        self.watch = watch

    def run(self, inflight: InFlight) -> Ending:
        """Run the delivery and return how it ends (not written: see :meth:`QueuePort.settle`).

        Every way out is an ending: completed, already processed, retry, deferred, dead,
        refused (a write of this stale delivery was refused), or ``lost`` when the store failed
        mid-delivery (nothing to write: the lease expires and the next fetch of the job closes
        the attempt as lost).
        """
        started = time.monotonic()
        inflight.run_started = started
        with self.hooks.delivering(inflight.delivery):
            try:
                return self._run(inflight, started)
            except GuardLost as exc:
                return self.refused(
                    inflight, exc, self._closing(inflight, started, inflight.context)
                )
            except JobGuardError as exc:
                self.hooks.store_error("pipeline", exc)
                closing = self._closing(inflight, started, inflight.context)
                return lost(inflight, closing, f"store error: {exc}")

    def report(self, inflight: InFlight, ending: Ending) -> None:
        """Tell the hooks how a delivery ended, with what the attempt log holds of it."""
        if self.hooks.silent:
            return
        lock = ending.guard.lock
        error = ending.error
        closing = ending.closing
        duration_s = closing.duration_s
        self.hooks.attempt_ended(
            AttemptEvent(
                delivery=inflight.delivery,
                worker_id=self.worker_id,
                outcome=ending.outcome,
                duration_s=duration_s,
                lock_owner=lock.owner if lock else None,
                fence=lock.fence if lock else None,
                steps_run=closing.steps_run,
                steps_skipped=closing.steps_skipped,
                reason=ending.reason,
                error_type=error.type if error else None,
                error_message=error.message if error else None,
            )
        )
        self.hooks.delivery_settled(inflight.delivery, ending.outcome, duration_s)

    def adopt(self, prepared: Prepared) -> InFlight:
        """Hold a delivery fetched with its begin; :meth:`run` uses what the begin got, and a
        grant taken there is renewed by the heartbeat from now on."""
        inflight = InFlight(prepared.delivery, guard_of(prepared.delivery), None)
        if prepared.granted_at is not None:  # ctx.lease_lost counts from the lease's start
            inflight.renewed_at = prepared.granted_at
        if prepared.begun is not None and prepared.request is not None:
            inflight.begun = prepared.begun
            _hold(inflight, prepared.begun, prepared.request)
        return inflight

    def _closing(self, inflight: InFlight, started: float, ctx: Context | None = None) -> Closing:
        """How the delivery ends, for its final write; from now on a lost lease is reported by
        that write's refusal, not by the heartbeat (which may see a job finished under it)."""
        inflight.closing = True
        duration = time.monotonic() - started
        if ctx is None:
            return Closing(duration)
        return Closing(duration, steps_run=ctx.steps_run, steps_skipped=ctx.steps_skipped)

    def _bury_unrunnable(
        self,
        inflight: InFlight,
        reason: str,
        started: float,
        code: DeadCode = DeadCode.UNRUNNABLE,
    ) -> Ending:
        reason = storable(reason)
        error = ErrorInfo(type="Unrunnable", message=reason)
        closing = self._closing(inflight, started)
        return Ending(inflight.guard, closing, Outcome.DEAD, code=code, reason=reason, error=error)

    def _arguments(self, delivery: Delivery, task: Task) -> dict[str, Any] | str:
        """The job's arguments, or why the job cannot run (whatever shape the stored payload
        has, or a stored number this version never writes)."""
        if delivery.unrunnable is not None:
            return delivery.unrunnable
        arguments = decode_object(delivery.payload)
        if isinstance(arguments, str):
            return arguments
        mismatch = task.keyword_fit.mismatch(arguments)
        if mismatch is not None:
            return f"payload does not match the handler's arguments: {mismatch}"
        return arguments

    def _run(self, inflight: InFlight, started: float) -> Ending:
        delivery = inflight.delivery
        task = self.tasks.get(delivery.task)
        if delivery.cancel_requested_by is not None or task is None:
            return self._not_run(inflight, started)
        arguments = self._arguments(delivery, task)
        if isinstance(arguments, str):
            return self._bury_unrunnable(inflight, arguments, started)
        if delivery.time_limit_s is not None and not self.hard_limits:
            return self._defer(inflight, task, started, messages.needs_hard_limits(delivery))

        stored_steps: dict[str, Any] = {}
        begun = inflight.begun  # taken in the fetch's transaction, already held
        if begun is None:
            request = begin_request(delivery, task.delivery_rules(), self.worker_id)
            if request is not None:
                begun = self.backend.begin(inflight.guard, request)
                _hold(inflight, begun, request)
        if begun is not None:
            if begun.busy is not None:
                reason = messages.busy(
                    begun.busy,
                    delivery.resource_key,
                    delivery.operation_key,
                    delivery.concurrency_key,
                    delivery.concurrency_limit,
                )
                return self._defer(inflight, task, started, reason)
            operation = begun.operation
            if operation is not None and operation.status == OperationStatus.COMPLETED:
                closing = self._closing(inflight, started)
                return Ending(
                    inflight.guard, closing, Outcome.ALREADY_PROCESSED, reason="already processed"
                )
            if operation is not None:
                stored_steps = operation.steps

        return self._execute(inflight, task, arguments, stored_steps, started)

    def _not_run(self, inflight: InFlight, started: float) -> Ending:
        """A delivery whose handler must not run: its job was cancelled while an earlier run
        went on and that run ended without learning it (its worker died, or it was retried or
        handed back), and a cancelled job never runs again; or its task is unknown here."""
        delivery = inflight.delivery
        actor = delivery.cancel_requested_by
        if actor is None:
            return self._bury_unrunnable(
                inflight, f"unknown task {delivery.task!r}: no handler registered", started
            )
        inflight.stop(JobCancelled(messages.cancelled(delivery.job_id, actor)))
        return self.stopped(inflight, None)

    def _execute(
        self,
        inflight: InFlight,
        task: Task,
        arguments: dict[str, Any],
        stored_steps: dict[str, Any],
        started: float,
    ) -> Ending:
        """Run the handler with its context; return its success or its failure."""
        ctx = Context(
            backend=self.backend,
            inflight=inflight,
            worker_id=self.worker_id,
            stored_steps=stored_steps,
            hooks=self.hooks,
        )
        inflight.context = ctx
        inflight.start_clock()
        try:
            value = self._watched(inflight, task, ctx, arguments)
        except GuardLost:
            raise
        except RunStopped as exc:
            if inflight.stop_reason is None:  # raised by the handler itself: take it as said
                inflight.stop(exc)
            return self.stopped(inflight, task)
        except (Exception, SystemExit, KeyboardInterrupt) as exc:
            if inflight.stop_reason is not None:
                # It failed after being told to stop (its I/O cut short, say): the stop decides.
                return self.stopped(inflight, task)
            # sys.exit() or argparse in a handler ends that job as a failure (retried or buried
            # by its rules), never the handler thread: the slot keeps working.
            return self._failed(inflight, task, exc, self._closing(inflight, started, ctx))
        try:
            if too_deep(value):
                raise ValueError(f"it nests deeper than {MAX_NESTING} levels")
            result_json = json.dumps(value, allow_nan=False) if value is not None else None
        except (TypeError, ValueError) as exc:
            # A programming error that every rerun repeats: never retry it (its steps are kept).
            unjsonable = Fatal(f"the handler returned a value that is not JSON: {exc}")
            return self._failed(inflight, task, unjsonable, self._closing(inflight, started, ctx))
        return Ending(
            inflight.guard,
            self._closing(inflight, started, ctx),
            Outcome.COMPLETED,
            operation_key=inflight.delivery.operation_key,
            result_json=result_json,
            external_ref=ctx.external_ref,
        )

    def _watched(
        self, inflight: InFlight, task: Task, ctx: Context, arguments: dict[str, Any]
    ) -> Any:
        """Run the handler, telling the watch (if any) when it starts and when it stops."""
        if self.watch is None:
            return self._call(task, ctx, arguments, inflight)
        self.watch.handler_started(inflight)
        try:
            return self._call(task, ctx, arguments, inflight)
        finally:
            self.watch.handler_ended(inflight)

    def _call(self, task: Task, ctx: Context, arguments: dict[str, Any], inflight: InFlight) -> Any:
        """Run the handler; a coroutine (an async handler's) is awaited on the worker's loop."""
        value = task.fn(ctx, **arguments)
        if inspect.iscoroutine(value):
            if self.run_async is None:
                value.close()
                raise Fatal("this pipeline has no event loop to run an async handler on")
            value = self.run_async(_stoppable(value, inflight))
        return value

    def stopped(self, inflight: InFlight, task: Task | None) -> Ending:
        """How a run told to stop ends (``inflight.stop_reason``): a cancelled one is buried
        as cancelled, never retried; one past its soft time limit is recorded as timed out and
        retried as a transient failure, or buried by the task's rules (attempts spent, the
        same timeout again and again).

        Also the ending the worker writes for a run it gives up on (the handler never
        cooperated), from another thread than the handler's: it reads only the delivery.
        """
        reason = inflight.stop_reason
        assert reason is not None
        ctx = inflight.context
        closing = self._closing(inflight, inflight.run_started, ctx)
        delivery = inflight.delivery
        if isinstance(reason, TimeLimitExceeded) and task is not None:
            # A fresh error without a traceback: every timeout of a job has one signature, so
            # a job that keeps timing out is seen as repeating itself (poison, spent attempts).
            return self._failed(inflight, task, type(reason)(str(reason)), closing)
        error = ErrorInfo(type=type(reason).__name__, message=describe(reason))
        return Ending(
            inflight.guard,
            closing,
            Outcome.DEAD,
            code=DeadCode.CANCELLED,
            reason=storable(str(reason)),
            error=error,
            operation_key=delivery.operation_key,
        )

    def _defer(self, inflight: InFlight, task: Task, started: float, reason: str) -> Ending:
        delivery = inflight.delivery
        waited_s = self.backend.now() - delivery.created_at  # both on the store clock
        if waited_s > task.max_defer_s:
            return self._bury_unrunnable(
                inflight,
                f"{reason}; waited {waited_s:.0f}s, longer than max_defer_s={task.max_defer_s:g}",
                started,
                DeadCode.WAITED,
            )
        return Ending(
            inflight.guard,
            self._closing(inflight, started),
            Outcome.DEFERRED,
            delay_s=deferral_delay_s(delivery.deferrals, self.rng),
            reason=reason,
            error=ErrorInfo(type="ResourceBusy", message=reason),
        )

    def _failed(
        self, inflight: InFlight, task: Task, exc: BaseException, closing: Closing
    ) -> Ending:
        """A failed run retried or buried by the task's rules; a timeout keeps its outcome."""
        delivery = inflight.delivery
        signature = error_signature(exc)
        # A streak's count stops at the largest every store holds: one stored there (by hand)
        # must not make this ending unwritable.
        if signature == delivery.error_signature:
            same = min(delivery.same_error_count + 1, MAX_COUNT)
        else:
            same = 1
        # Poison only when this job's failure stands out: the attempt log says (read only then).
        history = history_for(self.backend, delivery, exc, task.policy, same, self.backend.now)
        decision: Decision = decide(
            exc,
            attempt=delivery.attempt,
            policy=task.policy,
            same_signature_count=same,
            rng=self.rng,
            history=history,
        )
        error = ErrorInfo(
            type=storable(type(exc).__name__),
            message=describe(exc),
            traceback=_traceback_text(exc),
            signature=signature,
            same_count=same,
        )
        timed_out = isinstance(exc, TimeLimitExceeded)
        if decision.verdict is Verdict.RETRY:
            return Ending(
                inflight.guard,
                closing,
                Outcome.TIMED_OUT if timed_out else Outcome.RETRY,
                delay_s=decision.delay_s,
                reason=decision.reason,
                error=error,
                operation_key=delivery.operation_key,
            )
        return Ending(
            inflight.guard,
            closing,
            Outcome.TIMED_OUT if timed_out else Outcome.DEAD,
            code=decision.code or DeadCode.FATAL,
            reason=decision.reason,
            error=error,
            operation_key=delivery.operation_key,
        )

    def refused(self, inflight: InFlight, exc: GuardLost, closing: Closing) -> Ending:
        """A write was refused: this delivery is stale. It ends as refused, never done.

        Only the lock may be lost (a stale fence) while the lease is still ours: then the
        ending also hands the job back uncharged, so it runs again under a fresh lock, and the
        stale work is discarded.
        """
        reason = describe(exc)
        stalled_s = inflight.stood_still_s()
        if stalled_s:  # the process stood still: say so, it is not a slow handler
            reason += messages.stood_still(stalled_s)
        inflight.mark_lost(reason)
        error = ErrorInfo(type(exc).__name__, reason)
        if isinstance(exc, StaleFenceError):
            delay_s = deferral_delay_s(0, self.rng)
            return Ending(
                inflight.guard, closing, Outcome.FENCE_REFUSED, delay_s, reason=reason, error=error
            )
        return Ending(inflight.guard, closing, Outcome.LEASE_REFUSED, reason=reason, error=error)


async def _stoppable(coroutine: Coroutine[Any, Any, Any], inflight: InFlight) -> Any:
    """Await an async handler so that telling its run to stop cancels it: the cancellation
    comes back as the stop's own error, which the pipeline ends the run with."""
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()

    def cancel() -> None:
        loop.call_soon_threadsafe(task.cancel)

    inflight.canceller = cancel
    try:
        if inflight.stop_error() is not None:
            coroutine.close()
            raise asyncio.CancelledError
        return await coroutine
    except asyncio.CancelledError:
        reason = inflight.stop_reason
        if reason is None:
            raise  # cancelled by the loop's close at shutdown, not by a stop
        raise type(reason)(str(reason)) from None
    finally:
        inflight.canceller = None


def lost(inflight: InFlight, closing: Closing, reason: str) -> Ending:
    """A delivery whose ending cannot be written (the store failed): left to its lease."""
    inflight.closing = True
    return Ending(inflight.guard, closing, Outcome.LOST, reason=reason)


def _traceback_text(exc: BaseException) -> str:
    """The formatted traceback, made storable (bounded; a hostile ``__str__`` cannot break it)."""
    try:
        text = "".join(traceback.format_exception(exc))
    except Exception as error:  # formatting calls user code (__str__, __repr__ of notes)
        text = f"traceback unavailable: formatting it raised {type(error).__name__}"
    if len(text) > MAX_TRACEBACK_CHARS:  # the end holds the error itself: keep that part
        text = "[traceback cut]\n" + text[-MAX_TRACEBACK_CHARS:]
    return storable(text, MAX_TRACEBACK_CHARS + 100)
