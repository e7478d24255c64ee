"""The guarded execution pipeline, written once for every backend (the article's ``processJob``).

::

    delivery (leased) ─► known task? JSON object? arguments fit? ── no ─► dead letter queue
        ─► resource lock (owner token, fence) ── busy ─► defer (attempt not charged)
        ─► operation record ── completed ─► ack "already processed"
        ─► handler(ctx)  (steps memoised, db_step effects in the step's transaction)
        ─► finish: operation completed + job acked + attempt closed + lock released, atomically
           (returned pending as ``Settled.ack``; the worker writes many in one commit: complete())
        ─► on error: classify ─► transient: retry with backoff │ fatal/spent/poison: bury
    A write refused for a stale lease or fence is recorded on this delivery's attempt and the
    job is left to its current owner: the stale worker never acks.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import random
import secrets
import time
import traceback
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from jobguard.backends.base import (
    Backend,
    BeginRequest,
    Begun,
    Closing,
    ErrorInfo,
    FinishRequest,
    Prepared,
)
from jobguard.context import Context, InFlight
from jobguard.core import messages
from jobguard.core.jsonvalues import MAX_NESTING, decode_object, too_deep
from jobguard.core.retry import Decision, Verdict, decide, deferral_delay_s, error_signature
from jobguard.core.text import MAX_TRACEBACK_CHARS, describe, storable
from jobguard.exceptions import Fatal, GuardLost, JobGuardError, LeaseLostError, StaleFenceError
from jobguard.hooks import AttemptEvent
from jobguard.models import DeadCode, Delivery, Guard, OperationStatus, Outcome

if TYPE_CHECKING:
    from jobguard.hooks import Hooks
    from jobguard.task import Task

RunAsync = Callable[[Coroutine[Any, Any, Any]], Any]


@dataclass(frozen=True, slots=True)
class Settled:
    """How the pipeline ended one delivery (for hooks, stats and tests).

    ``ack`` is set when the delivery succeeded and its finish is still to be written: the worker
    collects these and writes them in batches (:meth:`Pipeline.complete`). Until then the job is
    not done — its lease is still held and renewed.
    """

    outcome: Outcome
    reason: str = ""
    ack: FinishRequest | None = None
    error: ErrorInfo | None = None


def guard_of(delivery: Delivery) -> Guard:
    """The guard of a fresh delivery (no lock yet)."""
    return Guard(
        job_id=delivery.job_id, lease_token=delivery.lease_token, attempt_id=delivery.attempt_id
    )


def _hold(inflight: InFlight, begun: Begun, request: BeginRequest) -> None:
    """Carry a lock grant on the delivery, so later writes prove its fence and it is renewed."""
    if begun.grant is not None:
        inflight.guard = replace(inflight.guard, lock=begun.grant)
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
    ) -> None:
        self.backend = backend
        self.tasks = tasks
        self.worker_id = worker_id
        self.hooks = hooks
        self.rng = rng or random.Random()
        # Where coroutines of async handlers run: the worker's event loop thread.
        self.run_async = run_async

    def run(self, inflight: InFlight) -> Settled:
        """Run the delivery up to its finish, which is returned as ``Settled.ack`` (not written).

        Failures, deferrals and refusals are written here; a success is written by
        :meth:`complete`, so that a worker can ack many jobs in one durable commit.
        """
        started = time.monotonic()
        with self.hooks.delivering(inflight.delivery):
            try:
                settled = self._run(inflight, started)
            except GuardLost as exc:
                settled = self._refused(
                    inflight, exc, self._closing(inflight, started, inflight.context)
                )
            except JobGuardError as exc:
                # The store failed mid-delivery: the lease expires and the attempt is closed as
                # lost by the next fetch of the job, which is what hooks hear now.
                lost = Settled(Outcome.LOST, f"store error: {exc}")
                self._report(inflight, lost, time.monotonic() - started)
                raise
            if settled.ack is None:
                self._report(inflight, settled, time.monotonic() - started)
        return settled

    def _report(self, inflight: InFlight, settled: Settled, duration_s: float) -> None:
        """Tell the hooks how a delivery ended, with what the attempt log holds of it."""
        ctx = inflight.context
        lock = inflight.guard.lock
        error = settled.error
        self.hooks.attempt_ended(
            AttemptEvent(
                delivery=inflight.delivery,
                worker_id=self.worker_id,
                outcome=settled.outcome,
                duration_s=duration_s,
                lock_owner=lock.owner if lock else None,
                fence=lock.fence if lock else None,
                steps_run=ctx.steps_run if ctx else 0,
                steps_skipped=ctx.steps_skipped if ctx else 0,
                reason=settled.reason,
                error_type=error.type if error else None,
                error_message=error.message if error else None,
            )
        )
        self.hooks.delivery_settled(inflight.delivery, settled.outcome, duration_s)

    def complete(self, batch: Sequence[tuple[InFlight, Settled]]) -> list[Settled]:
        """Write the finishes of successful deliveries in one store call (batched acks).

        A finish the store refuses (stale lease or fence) is recorded as a refusal: the stale
        worker never acks.
        """
        acks = [settled.ack for _, settled in batch if settled.ack is not None]
        if len(acks) != len(batch):
            raise ValueError("complete() takes only deliveries whose finish is pending")
        try:
            refusals = self.backend.finish_many(acks)
        except JobGuardError as exc:
            # Not acked: the leases expire and the next fetch closes these attempts as lost.
            for (inflight, _), ack in zip(batch, acks, strict=True):
                lost = Settled(Outcome.LOST, f"ack failed: {exc}")
                self._report(inflight, lost, ack.closing.duration_s)
            raise
        results: list[Settled] = []
        for (inflight, settled), refusal, ack in zip(batch, refusals, acks, strict=True):
            if refusal is None:
                final = Settled(settled.outcome, settled.reason)
            elif isinstance(refusal, GuardLost):
                final = self._refused(inflight, refusal, ack.closing)
            else:
                # This one finish could not be written: the job is left to its lease and runs
                # again (its steps are skipped); the rest of the batch was acked.
                self.hooks.store_error("ack", refusal)
                final = Settled(Outcome.LOST, f"not acked: {refusal}")
            self._report(inflight, final, ack.closing.duration_s)
            results.append(final)
        return results

    def begin_request(self, delivery: Delivery, task: Task) -> BeginRequest | None:
        """What must hold before the handler runs: a lock, an operation claim, or nothing."""
        if delivery.resource_key is None and delivery.operation_key is None:
            return None
        return BeginRequest(
            resource_key=delivery.resource_key,
            lock_owner=f"{self.worker_id}/{secrets.token_hex(8)}",
            lock_ttl_s=task.lock_ttl_s,  # the worker's definition, not the enqueuer's copy
            operation_key=delivery.operation_key,
        )

    def request_for(self, delivery: Delivery) -> BeginRequest | None:
        """What a fetched delivery must hold before its handler (``None`` for an unknown task,
        which the pipeline buries, and for a task without keys)."""
        task = self.tasks.get(delivery.task)
        return self.begin_request(delivery, task) if task else None

    def adopt(self, prepared: Prepared) -> InFlight:
        """Hold a delivery fetched with its begin; :meth:`run` uses what the begin got, and a
        grant taken there is renewed by the heartbeat from now on."""
        inflight = InFlight(prepared.delivery, guard_of(prepared.delivery), None)
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
    ) -> Settled:
        reason = storable(reason)
        error = ErrorInfo(type="Unrunnable", message=reason)
        self.backend.bury(
            inflight.guard, self._closing(inflight, started), code=code, reason=reason, error=error
        )
        return Settled(Outcome.DEAD, reason, error=error)

    def _arguments(self, delivery: Delivery, task: Task) -> dict[str, Any] | str:
        """The job's arguments, or why they cannot be (whatever shape the stored payload has)."""
        arguments = decode_object(delivery.payload)
        if isinstance(arguments, str):
            return arguments
        try:
            task.signature.bind(None, **arguments)
        except TypeError as exc:
            return f"payload does not match the handler's arguments: {exc}"
        return arguments

    def _run(self, inflight: InFlight, started: float) -> Settled:
        delivery = inflight.delivery
        task = self.tasks.get(delivery.task)
        if task is None:
            return self._bury_unrunnable(
                inflight, f"unknown task {delivery.task!r}: no handler registered", started
            )
        arguments = self._arguments(delivery, task)
        if isinstance(arguments, str):
            return self._bury_unrunnable(inflight, arguments, started)

        stored_steps: dict[str, Any] = {}
        begun = inflight.begun  # taken in the fetch's transaction, already held
        if begun is None:
            request = self.begin_request(delivery, task)
            if request is not None:
                begun = self.backend.begin(inflight.guard, request)
                _hold(inflight, begun, request)
        if begun is not None:
            if begun.busy is not None:
                reason = messages.busy(begun.busy, delivery.resource_key, delivery.operation_key)
                return self._defer(inflight, task, started, reason)
            operation = begun.operation
            if operation is not None and operation.status == OperationStatus.COMPLETED:
                ack = FinishRequest(
                    inflight.guard,
                    self._closing(inflight, started),
                    outcome=Outcome.ALREADY_PROCESSED,
                )
                return Settled(Outcome.ALREADY_PROCESSED, "already processed", ack=ack)
            if operation is not None:
                stored_steps = operation.steps

        return self._execute(inflight, task, arguments, stored_steps, started)

    def _execute(
        self,
        inflight: InFlight,
        task: Task,
        arguments: dict[str, Any],
        stored_steps: dict[str, Any],
        started: float,
    ) -> Settled:
        """Run the handler with its context; return the pending finish or the failure."""
        ctx = Context(
            backend=self.backend,
            inflight=inflight,
            worker_id=self.worker_id,
            stored_steps=stored_steps,
            hooks=self.hooks,
        )
        inflight.context = ctx
        try:
            value = self._call(task, ctx, arguments)
        except GuardLost:
            raise
        except Exception as exc:
            return self._failed(inflight, task, ctx, exc, started)
        try:
            if too_deep(value):
                raise ValueError(f"it nests deeper than {MAX_NESTING} levels")
            result_json = json.dumps(value, allow_nan=False) if value is not None else None
        except (TypeError, ValueError) as exc:
            # A programming error that every rerun repeats: never retry it (its steps are kept).
            unjsonable = Fatal(f"the handler returned a value that is not JSON: {exc}")
            return self._failed(inflight, task, ctx, unjsonable, started)
        ack = FinishRequest(
            inflight.guard,
            self._closing(inflight, started, ctx),
            operation_key=inflight.delivery.operation_key,
            result_json=result_json,
            external_ref=ctx.external_ref,
        )
        return Settled(Outcome.COMPLETED, ack=ack)

    def _call(self, task: Task, ctx: Context, arguments: dict[str, Any]) -> Any:
        """Run the handler; a coroutine (an async handler's) is awaited on the worker's loop."""
        value = task.fn(ctx, **arguments)
        if inspect.iscoroutine(value):
            if self.run_async is None:
                value.close()
                raise Fatal("this pipeline has no event loop to run an async handler on")
            value = self.run_async(value)
        return value

    def _defer(self, inflight: InFlight, task: Task, started: float, reason: str) -> Settled:
        delivery = inflight.delivery
        waited_s = self.backend.now() - delivery.created_at  # both on the store clock
        if waited_s > task.max_defer_s:
            return self._bury_unrunnable(
                inflight,
                f"{reason}; waited {waited_s:.0f}s, longer than max_defer_s={task.max_defer_s:g}",
                started,
                DeadCode.WAITED,
            )
        delay = deferral_delay_s(delivery.deferrals, self.rng)
        self.backend.defer(
            inflight.guard, self._closing(inflight, started), delay_s=delay, reason=reason
        )
        return Settled(Outcome.DEFERRED, reason)

    def _failed(
        self, inflight: InFlight, task: Task, ctx: Context, exc: Exception, started: float
    ) -> Settled:
        delivery = inflight.delivery
        signature = error_signature(exc)
        same = delivery.same_error_count + 1 if signature == delivery.error_signature else 1
        decision: Decision = decide(
            exc,
            attempt=delivery.attempt,
            policy=task.policy,
            same_signature_count=same,
            rng=self.rng,
        )
        error = ErrorInfo(
            type=storable(type(exc).__name__),
            message=describe(exc),
            traceback=_traceback_text(exc),
            signature=signature,
            same_count=same,
        )
        closing = self._closing(inflight, started, ctx)
        if decision.verdict is Verdict.RETRY:
            self.backend.retry(
                inflight.guard,
                closing,
                delay_s=decision.delay_s,
                error=error,
                operation_key=delivery.operation_key,
            )
            return Settled(Outcome.RETRY, decision.reason, error=error)
        self.backend.bury(
            inflight.guard,
            closing,
            code=decision.code or DeadCode.FATAL,
            reason=decision.reason,
            error=error,
            operation_key=delivery.operation_key,
        )
        return Settled(Outcome.DEAD, decision.reason, error=error)

    def _refused(self, inflight: InFlight, exc: GuardLost, closing: Closing) -> Settled:
        """A write was refused: this delivery is stale. Record it; never ack."""
        reason = describe(exc)
        if isinstance(exc, StaleFenceError):
            # The lease may still be ours (only the lock was lost): hand the job back uncharged
            # so it runs again under a fresh lock; the stale work is discarded.
            with contextlib.suppress(LeaseLostError):
                self.backend.defer(
                    inflight.guard, closing, delay_s=deferral_delay_s(0, self.rng), reason=reason
                )
            outcome = Outcome.FENCE_REFUSED
        else:
            outcome = Outcome.LEASE_REFUSED
        inflight.mark_lost(reason)
        self.backend.record_refusal(inflight.guard, outcome, closing, reason)
        return Settled(outcome, reason, error=ErrorInfo(type(exc).__name__, reason))


def _traceback_text(exc: BaseException) -> str:
    """The formatted traceback, made storable (bounded; a hostile ``__str__`` cannot break it)."""
    try:
        text = "".join(traceback.format_exception(exc))
    except Exception as error:  # formatting calls user code (__str__, __repr__ of notes)
        text = f"traceback unavailable: formatting it raised {type(error).__name__}"
    if len(text) > MAX_TRACEBACK_CHARS:  # the end holds the error itself: keep that part
        text = "[traceback cut]\n" + text[-MAX_TRACEBACK_CHARS:]
    return storable(text, MAX_TRACEBACK_CHARS + 100)
