"""The guarded execution pipeline, written once for every backend (the article's ``processJob``).

::

    delivery (leased) ─► known task? JSON object? arguments fit? ── no ─► dead letter queue
        ─► resource lock (owner token, fence) ── busy ─► defer (attempt not charged)
        ─► operation record ── completed ─► ack "already processed"
        ─► handler(ctx)  (steps memoised, db_step effects in the step's transaction)
        ─► finish: operation completed + job acked + attempt closed + lock released, atomically
        ─► on error: classify ─► transient: retry with backoff │ fatal/spent/poison: bury
    A write refused for a stale lease or fence is recorded on this delivery's attempt and the
    job is left to its current owner: the stale worker never acks.
"""

from __future__ import annotations

import json
import random
import secrets
import time
import traceback
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from jobguard.backends.base import Backend, Closing, ErrorInfo
from jobguard.context import Context, InFlight
from jobguard.core.retry import Decision, Verdict, decide, deferral_delay_s, error_signature
from jobguard.exceptions import GuardLost, LeaseLostError, StaleFenceError
from jobguard.models import Delivery, Guard, Outcome, OperationStatus

if TYPE_CHECKING:
    from jobguard.hooks import Hooks
    from jobguard.task import Task


@dataclass(frozen=True, slots=True)
class Settled:
    """How the pipeline ended one delivery (for hooks, stats and tests)."""

    outcome: Outcome
    reason: str = ""


def guard_of(delivery: Delivery) -> Guard:
    """The guard of a fresh delivery (no lock yet)."""
    return Guard(job_id=delivery.job_id, lease_token=delivery.lease_token, attempt_id=delivery.attempt_id)


class Pipeline:
    """Runs one delivery through the guard layers; see the module docstring."""

    def __init__(
        self,
        backend: Backend,
        tasks: Mapping[str, Task],
        worker_id: str,
        hooks: Hooks,
        rng: random.Random | None = None,
    ) -> None:
        self.backend = backend
        self.tasks = tasks
        self.worker_id = worker_id
        self.hooks = hooks
        self.rng = rng or random.Random()

    def run(self, inflight: InFlight) -> Settled:
        """Take the delivery to a settled state (or leave it to its new owner if stale)."""
        started = time.monotonic()
        try:
            settled = self._run(inflight, started)
        except GuardLost as exc:
            settled = self._refused(inflight, exc, started)
        self.hooks.delivery_settled(inflight.delivery, settled.outcome, time.monotonic() - started)
        return settled

    def _closing(self, started: float, ctx: Context | None = None) -> Closing:
        duration = time.monotonic() - started
        if ctx is None:
            return Closing(duration)
        return Closing(duration, steps_run=ctx.steps_run, steps_skipped=ctx.steps_skipped)

    def _bury_unrunnable(self, inflight: InFlight, reason: str, started: float) -> Settled:
        error = ErrorInfo(type="Unrunnable", message=reason)
        self.backend.bury(inflight.guard, self._closing(started), reason=reason, error=error)
        return Settled(Outcome.DEAD, reason)

    def _arguments(self, delivery: Delivery, task: Task) -> dict[str, Any] | str:
        try:
            arguments = json.loads(delivery.payload)
        except ValueError as exc:
            return f"payload is not valid JSON: {exc}"
        if not isinstance(arguments, dict):
            return f"payload is not a JSON object but {type(arguments).__name__}"
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

        if delivery.resource_key is not None:
            busy = self._lock(inflight, task, started)
            if busy is not None:
                return busy

        stored_steps: dict[str, Any] = {}
        if delivery.operation_key is not None:
            operation = self.backend.begin_operation(
                inflight.guard, delivery.operation_key, delivery.resource_key
            )
            if operation is None:
                return self._defer(
                    inflight, task, started, f"operation {delivery.operation_key!r} is in progress"
                )
            if operation.status == OperationStatus.COMPLETED:
                self.backend.finish(
                    inflight.guard, self._closing(started), outcome=Outcome.ALREADY_PROCESSED
                )
                return Settled(Outcome.ALREADY_PROCESSED, "already processed")
            stored_steps = operation.steps

        ctx = Context(
            backend=self.backend,
            inflight=inflight,
            worker_id=self.worker_id,
            stored_steps=stored_steps,
        )
        inflight.started = True
        try:
            value = task.fn(ctx, **arguments)
            result_json = json.dumps(value) if value is not None else None
        except GuardLost:
            raise
        except Exception as exc:
            return self._failed(inflight, task, ctx, exc, started)
        self.backend.finish(
            inflight.guard,
            self._closing(started, ctx),
            operation_key=delivery.operation_key,
            result_json=result_json,
            external_ref=ctx.external_ref,
        )
        return Settled(Outcome.COMPLETED)

    def _lock(self, inflight: InFlight, task: Task, started: float) -> Settled | None:
        delivery = inflight.delivery
        assert delivery.resource_key is not None
        owner = f"{self.worker_id}/{secrets.token_hex(8)}"
        ttl_s = delivery.lock_ttl_s or task.lock_ttl_s
        grant = self.backend.acquire_lock(
            delivery.resource_key, owner, ttl_s, attempt_id=delivery.attempt_id
        )
        if grant is None:
            return self._defer(inflight, task, started, f"resource is busy: {delivery.resource_key}")
        inflight.guard = replace(inflight.guard, lock=grant)
        inflight.lock_ttl_s = ttl_s
        return None

    def _defer(self, inflight: InFlight, task: Task, started: float, reason: str) -> Settled:
        delivery = inflight.delivery
        waited_s = time.time() - delivery.created_at
        if waited_s > task.max_defer_s:
            return self._bury_unrunnable(
                inflight,
                f"{reason}; waited {waited_s:.0f}s, longer than max_defer_s={task.max_defer_s:g}",
                started,
            )
        delay = deferral_delay_s(delivery.deferrals, self.rng)
        self.backend.defer(inflight.guard, self._closing(started), delay_s=delay, reason=reason)
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
            type=type(exc).__name__,
            message=str(exc),
            traceback="".join(traceback.format_exception(exc)),
            signature=signature,
            same_count=same,
        )
        closing = self._closing(started, ctx)
        if decision.verdict is Verdict.RETRY:
            self.backend.retry(
                inflight.guard,
                closing,
                delay_s=decision.delay_s,
                error=error,
                operation_key=delivery.operation_key,
            )
            return Settled(Outcome.RETRY, decision.reason)
        self.backend.bury(
            inflight.guard,
            closing,
            reason=decision.reason,
            error=error,
            operation_key=delivery.operation_key,
        )
        return Settled(Outcome.DEAD, decision.reason)

    def _refused(self, inflight: InFlight, exc: GuardLost, started: float) -> Settled:
        """A write was refused: this delivery is stale. Record it; never ack."""
        closing = self._closing(started)
        if isinstance(exc, StaleFenceError):
            # The lease may still be ours (only the lock was lost): hand the job back uncharged
            # so it runs again under a fresh lock; the stale work is discarded.
            try:
                self.backend.defer(
                    inflight.guard, closing, delay_s=deferral_delay_s(0, self.rng), reason=str(exc)
                )
            except LeaseLostError:
                pass
            outcome = Outcome.FENCE_REFUSED
        else:
            outcome = Outcome.LEASE_REFUSED
        inflight.mark_lost(str(exc))
        self.backend.record_refusal(inflight.guard, outcome, closing, str(exc))
        return Settled(outcome, str(exc))
