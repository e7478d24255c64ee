"""What a handler sees of its delivery: identity, fence, memoised steps and idempotency keys."""

from __future__ import annotations

import asyncio
import inspect
import json
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from jobguard.core import messages
from jobguard.core.jsonvalues import inexact_part
from jobguard.core.keys import idempotency_key
from jobguard.core.text import storable
from jobguard.exceptions import ConfigurationError, RunStopped, StepError, TimeLimitExceeded
from jobguard.hooks import Hooks

if TYPE_CHECKING:
    from jobguard.backends.base import Backend, Begun
    from jobguard.models import Delivery, Guard
    from jobguard.steptx import StepTransactions

T = TypeVar("T")

MAX_STEP_NAME = 200
# A step's record is indexed on (operation key, step name), and PostgreSQL's B-tree holds an
# entry of at most 2704 bytes: 512 four-byte characters of key and 200 of name would not fit.
# Checked on every store, so a name never works on one and fails on the other.
MAX_STEP_RECORD_KEY_BYTES = 2600
STEP_NAMING = (
    "each step of one execution needs its own name; in a loop, put what varies into it, "
    'e.g. ctx.step(f"send-{recipient_id}", send, recipient_id)'
)


def stall_of_wait_s(wake_at: float, interval_s: float, now: float) -> float:
    """How long the process stood still under a heartbeat wait due at ``wake_at`` (monotonic):
    its overrun, if by a whole beat or more (a wait merely late is a busy machine), else 0."""
    overrun_s = now - wake_at
    return overrun_s if interval_s > 0 and overrun_s >= interval_s else 0.0


class InFlight:
    """A delivery the worker is holding: its current guard and whether it was lost.

    Shared between the handler thread, the heartbeat thread and the shutdown path.
    """

    def __init__(self, delivery: Delivery, guard: Guard, lock_ttl_s: float | None) -> None:
        self.delivery = delivery
        self.guard = guard
        self.lock_ttl_s = lock_ttl_s
        # A plain flag, not an Event: it is only ever set once and read, and one is made per job.
        self.lost = False
        self.lost_reason = ""
        # Lost by this worker's clock only (no renewal got through for a lease length); the
        # store may still hold it as ours, so the heartbeat keeps renewing it.
        self.judged_lost = False
        # A crash-loop suspect (its last attempt was lost): its worker runs it alone.
        self.solo = False
        self.started = False  # taken by a handler thread: shutdown waits for it, not releases it
        self.finishing = False  # handler done; its ending waits in the settler's batch
        # The pipeline is writing how the delivery ends: a refusal of that write reports a lost
        # lease; the heartbeat, which may renew a job just finished, does not.
        self.closing = False
        self.begun: Begun | None = None
        self.context: Context | None = None
        # When the lease was last known to be ours, on this worker's monotonic clock: fetched,
        # or the start of the last renewal that succeeded (the store extended it after that).
        self.renewed_at = time.monotonic()
        self.renewal_tried = False  # a beat has tried to renew it (its first is due early)
        # The longest time the heartbeat overslept while this delivery was held (monotonic): the
        # whole process stood still (stopped, a paused VM, swapping), not the handler alone.
        self.stalled_s = 0.0
        # The heartbeat's wait in progress (monotonic: when it should wake, the beat interval),
        # so a refusal met before the heartbeat wakes can tell a stall it has not marked yet.
        self.beat_wake_at: float | None = None
        self.beat_interval_s = 0.0
        # When the pipeline started running it (monotonic): its duration counts from here.
        self.run_started = time.monotonic()
        # When the run passes its soft time limit (monotonic; None: no limit or not started).
        self.soft_deadline: float | None = None
        # Why the run was told to stop (a passed soft limit, a cancel), and when (monotonic).
        self.stop_reason: RunStopped | None = None
        self.stopped_at = 0.0
        # The worker gave the run up: its ending was written for it (the handler never
        # cooperated); whatever the handler's thread does later is discarded.
        self.abandoned = False
        # Cancels an async handler's coroutine on the worker's loop (set while it runs).
        self.canceller: Callable[[], None] | None = None

    def stood_still_s(self) -> float:
        """How long the whole process stood still under this delivery: what the heartbeat
        marked, or, if its wait is still overrunning by a whole beat (the process resumed and
        this thread ran first), that overrun."""
        wake_at = self.beat_wake_at
        if wake_at is None:
            return self.stalled_s
        return max(self.stalled_s, stall_of_wait_s(wake_at, self.beat_interval_s, time.monotonic()))

    def mark_lost(self, reason: str) -> bool:
        """Record that the lease or lock is gone; the handler's writes will be refused.

        Returns whether this call marked it (False: it was lost already).
        """
        if self.lost:
            return False
        self.lost_reason = reason
        self.lost = True
        return True

    def start_clock(self) -> None:
        """The handler starts now: its soft time limit counts from here."""
        limit = self.delivery.soft_time_limit_s
        if limit is not None:
            self.soft_deadline = time.monotonic() + limit

    def timed_out(self, now: float | None = None) -> bool:
        """Whether the run passed its soft time limit (on this worker's monotonic clock)."""
        deadline = self.soft_deadline
        return deadline is not None and (time.monotonic() if now is None else now) >= deadline

    def stop(self, reason: RunStopped, now: float | None = None) -> bool:
        """Tell the run to stop: its next step raises ``reason`` and an async handler is
        cancelled. Returns whether this call told it (False: it was told already)."""
        if self.stop_reason is not None:
            return False
        self.stopped_at = time.monotonic() if now is None else now
        self.stop_reason = reason
        canceller = self.canceller
        if canceller is not None:
            canceller()
        return True

    def stop_error(self) -> RunStopped | None:
        """What the run's next step must raise, if it was told to stop or passed its limit."""
        if self.stop_reason is None and self.timed_out():
            self.stop(time_limit_exceeded(self.delivery))
        return self.stop_reason

    def guarded_s(self) -> float:
        """How long one renewal keeps this delivery: its lease, or its lock's TTL if shorter."""
        period = self.delivery.visibility_timeout_s
        if (self.guard.lock is not None or self.guard.slot is not None) and self.lock_ttl_s:
            period = min(period, self.lock_ttl_s)
        return period

    def overdue(self, now: float | None = None) -> bool:
        """Mark the delivery lost once a lease length passed since the last renewal that
        succeeded, whatever the renewal in progress does (it may hang on a dead network);
        True when this call marked it. A delivery whose handler is done is judged by its
        final write instead."""
        elapsed = (time.monotonic() if now is None else now) - self.renewed_at
        if self.lost or self.closing or elapsed < self.guarded_s():
            return False
        self.judged_lost = self.mark_lost(messages.lease_overdue(elapsed, self.guarded_s()))
        return self.judged_lost


def time_limit_exceeded(delivery: Delivery) -> TimeLimitExceeded:
    """The error of a run past its soft time limit (its text names the limit)."""
    return TimeLimitExceeded(
        f"job {delivery.job_id} ran past its soft time limit of "
        f"{delivery.soft_time_limit_s:g}s (soft_time_limit_s)"
    )


class Context:
    """Handed to every handler as its first argument.

    Attributes:
        job_id: The job's id (stable across retries and replays).
        attempt: This delivery's number, 1-based, charged at delivery.
        max_attempts: Deliveries allowed in total.
        worker_id: The worker process running it.
        queue: The queue it was fetched from.
        task_name: The registered task name.
        operation_key: The idempotency identity of the business action, if the task has one.
        resource_key: The resource locked for this run, if any.
        fence: The lock's fencing token (strictly increasing per resource), or ``None``.
        lock_owner: The lock's owner token, or ``None``.
        concurrency_key: The concurrency key whose slot this run holds, if any.
        slot: The number of that slot (0 to the limit minus one), or ``None``.
        slot_fence: The slot's fencing token (strictly increasing per slot), or ``None``.
    """

    def __init__(
        self,
        *,
        backend: Backend,
        inflight: InFlight,
        worker_id: str,
        stored_steps: dict[str, Any],
        hooks: Hooks | None = None,
    ) -> None:
        delivery = inflight.delivery
        self._backend = backend
        self._hooks = hooks or Hooks()
        self._inflight = inflight
        self._steps = dict(stored_steps)
        self.job_id = delivery.job_id
        self.attempt = delivery.attempt
        self.max_attempts = delivery.max_attempts
        self.worker_id = worker_id
        self.queue = delivery.queue
        self.task_name = delivery.task
        self.operation_key = delivery.operation_key
        self.resource_key = delivery.resource_key
        lock = inflight.guard.lock
        self.fence: int | None = lock.fence if lock else None
        self.lock_owner: str | None = lock.owner if lock else None
        held = inflight.guard.slot
        self.concurrency_key = delivery.concurrency_key
        self.slot: int | None = held.slot if held else None
        self.slot_fence: int | None = held.fence if held else None
        self.external_ref: str | None = None
        self._used_steps: set[str] = set()
        self.steps_run = 0
        self.steps_skipped = 0

    @property
    def lease_lost(self) -> bool:
        """True once the lease (or lock) may be another worker's; stop work early.

        It turns true when the heartbeat finds the lease taken over, and, on this worker's
        own monotonic clock, once a whole lease length passed since the last renewal that
        succeeded, even while a renewal hangs on a network that stopped answering. It never
        turns false again.
        """
        inflight = self._inflight
        if inflight.overdue():
            self._hooks.lease_lost(inflight.delivery, inflight.lost_reason)
        return inflight.lost

    @property
    def time_limit_passed(self) -> bool:
        """True once this run passed its soft time limit (``soft_time_limit_s``); stop work.

        From then on the next ``step``/``db_step`` raises
        :class:`~jobguard.exceptions.TimeLimitExceeded`. It never turns false again.
        """
        return isinstance(self._inflight.stop_error(), TimeLimitExceeded)

    @property
    def cancel_requested(self) -> bool:
        """True once an operator cancelled this job while it runs; stop work.

        The worker learns of it with the lease's next renewal; from then on the next
        ``step``/``db_step`` raises :class:`~jobguard.exceptions.JobCancelled`.
        """
        reason = self._inflight.stop_error()
        return reason is not None and not isinstance(reason, TimeLimitExceeded)

    def _check_running(self) -> None:
        """Refuse a step of a run told to stop (a passed soft limit, a cancel)."""
        reason = self._inflight.stop_error()
        if reason is not None:
            raise type(reason)(str(reason))

    def idempotency_key(self, name: str) -> str:
        """A key for an external API call, stable across attempts and replays (G4.4)."""
        base = self.operation_key if self.operation_key is not None else f"job:{self.job_id}"
        return idempotency_key(base, name)

    def set_external_ref(self, ref: str) -> None:
        """Store the external system's reference on the operation record at completion (G4.2).

        Text the store cannot hold (lone surrogates, NUL) is replaced by U+FFFD.
        """
        if not isinstance(ref, str):
            raise ConfigurationError(f"ctx.set_external_ref() takes text, not {ref!r}")
        self.external_ref = storable(ref)

    def _operation(self, what: str) -> str:
        if self.operation_key is None:
            raise ConfigurationError(
                f"ctx.{what}() needs the task to have an operation_key "
                '(e.g. @app.task(operation_key="fulfill-order:{order_id}"))'
            )
        return self.operation_key

    def _claim_step(self, what: str, name: str) -> tuple[str, bool]:
        """Check ``name`` for this execution; return the operation key and whether it is done.

        A name used twice in one execution is refused (:class:`StepError`): the second call
        would silently get the first call's result. On a retry, a name done before is done.
        A run told to stop is refused (:class:`~jobguard.exceptions.RunStopped`).
        """
        self._check_running()
        key = self._operation(what)
        if (
            not isinstance(name, str)
            or not name
            or len(name) > MAX_STEP_NAME
            or storable(name) != name  # a name the store refuses would rerun the step forever
        ):
            raise StepError(
                f"ctx.{what}() name must be non-empty text of at most {MAX_STEP_NAME} "
                f"characters, without NUL or lone surrogates, not {name!r}"
            )
        width = len(key.encode()) + len(name.encode())
        if width > MAX_STEP_RECORD_KEY_BYTES:
            raise StepError(
                f"ctx.{what}() name {name!r} and the operation key together take "
                f"{width} bytes of UTF-8; a step's record "
                f"is indexed on both and holds at most {MAX_STEP_RECORD_KEY_BYTES}: use a "
                "shorter name"
            )
        if name in self._used_steps:
            raise StepError(
                f"step name {name!r} was already used in this execution of job {self.job_id}; "
                + STEP_NAMING
            )
        self._used_steps.add(name)
        return key, name in self._steps

    def _memoised(self, name: str) -> Any:
        """The stored result of a step done before; counted and told to the hooks."""
        self.steps_skipped += 1
        self._hooks.step_skipped(self._inflight.delivery, name)
        return self._steps[name]

    def _checked(self, what: str, name: str, value: T) -> T:
        """Refuse a result that would come back different on a retry (before it is recorded)."""
        problem = inexact_part(value)
        if problem is not None:
            raise StepError(
                f"ctx.{what}({name!r}) returned a value that would not come back unchanged on "
                f"a retry: {problem}. Return JSON types only (convert before returning). The "
                "step was not recorded, so the job is buried: every rerun would repeat it"
            )
        return value

    def _recorded(self, key: str, name: str, value: T) -> T:
        self._backend.put_step(self._inflight.guard, key, name, json.dumps(value))
        self._steps[name] = value
        self.steps_run += 1
        return value

    def step(self, name: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run ``fn(*args, **kwargs)`` once per operation; on retries return its stored result.

        Each name may be used once per execution (:class:`~jobguard.exceptions.StepError`
        otherwise). The result must come back from JSON unchanged — dict with str keys, list,
        str, int, finite float, bool, None — and is returned exactly so on a retry; anything
        else is refused before the step is recorded. A step that raises is not recorded as done.
        Refused with :class:`~jobguard.exceptions.GuardLost` if this delivery is stale.
        """
        key, done = self._claim_step("step", name)
        if done:
            stored: T = self._memoised(name)
            return stored
        with self._hooks.running_step(self._inflight.delivery, name):
            value = self._checked("step", name, fn(*args, **kwargs))
            return self._recorded(key, name, value)

    async def step_async(self, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """:meth:`step` for async code: ``fn`` may be an ``async def`` (it is awaited).

        The store write runs on a thread, so the event loop is never blocked by it.
        """
        key, done = self._claim_step("step_async", name)
        if done:
            return self._memoised(name)
        with self._hooks.running_step(self._inflight.delivery, name):
            result = fn(*args, **kwargs)
            if inspect.isawaitable(result):
                result = await result
            value = self._checked("step_async", name, result)
            return await asyncio.to_thread(self._recorded, key, name, value)

    def db_step(
        self, name: str, fn: Callable[..., T], *args: Any, on: StepTransactions | None = None
    ) -> T:
        """Run ``fn(conn, *args)`` in one transaction with the step record (guarantee G5.2).

        ``conn`` offers ``execute``/``executemany`` on the app's own database; business rows
        written there commit if and only if the step record commits, exactly once per operation.
        Names and results follow the rules of :meth:`step`; a result that would not come back
        unchanged rolls the transaction back, so its rows are not written either.

        With ``on`` (e.g. :class:`jobguard.contrib.sqlalchemy.SQLAlchemySteps`, or
        :class:`jobguard.contrib.django.DjangoSteps`) the transaction runs on that framework's
        connection to the store's database and ``fn`` gets its handle (a session) instead.
        """
        key, done = self._claim_step("db_step", name)
        if done:
            stored: T = self._memoised(name)
            return stored
        if inspect.iscoroutinefunction(fn):
            raise StepError(
                f"ctx.db_step({name!r}) runs fn inside the store's transaction on a thread: "
                "it must be a plain function, not an async def"
            )

        def checked(conn: Any, *fn_args: Any) -> T:
            return self._checked("db_step", name, fn(conn, *fn_args))

        with self._hooks.running_step(self._inflight.delivery, name):
            ran, value = self._backend.db_step(self._inflight.guard, key, name, checked, args, on)
        self._steps[name] = value
        if ran:
            self.steps_run += 1
        else:
            self.steps_skipped += 1
        result: T = value
        return result

    def db_writes(self, name: str, statements: Sequence[tuple[Any, Any]]) -> None:
        """Run write ``statements`` in one transaction with the step record, once per operation.

        ``statements`` is a list of ``(sql, parameters)`` pairs (parameters ``None``, a sequence
        or a mapping, in the store's placeholder style, as ``db_step`` code writes them). It is
        :meth:`db_step` for writes whose SQL is known before they run: no function is called and
        no rows come back, so on PostgreSQL the whole transaction (the guard's proofs, the
        statements, the step record, the commit) travels in one round trip instead of one per
        statement. The guarantees are the same (G5.2): the statements commit if and only if the
        step record does, a stale delivery's statements never run, and on a retry a recorded
        step runs nothing. A failing statement raises
        :class:`~jobguard.exceptions.StepSQLError` after the whole step rolled back (not where
        it stands in the list: nothing is read between the statements).
        """
        key, done = self._claim_step("db_writes", name)
        if done:
            self._memoised(name)
            return
        writes = _writes(name, statements)
        with self._hooks.running_step(self._inflight.delivery, name):
            ran = self._backend.db_writes(self._inflight.guard, key, name, writes)
        self._steps[name] = None
        if ran:
            self.steps_run += 1
        else:
            self.steps_skipped += 1

    async def db_writes_async(self, name: str, statements: Sequence[tuple[Any, Any]]) -> None:
        """:meth:`db_writes` for async code: the transaction runs on a thread, off the loop."""
        await asyncio.to_thread(self.db_writes, name, statements)

    async def db_step_async(
        self, name: str, fn: Callable[..., Any], *args: Any, on: StepTransactions | None = None
    ) -> Any:
        """:meth:`db_step` for async code: the transaction runs on a thread, off the loop.

        ``fn`` is a plain function (it runs on that thread); ``on`` as in :meth:`db_step`.
        """
        return await asyncio.to_thread(self.db_step, name, fn, *args, on=on)


def _writes(name: str, statements: Any) -> list[tuple[Any, Any]]:
    """``ctx.db_writes`` statements as ``(sql, parameters)`` pairs, or why they are not."""
    if isinstance(statements, str | bytes) or not isinstance(statements, Sequence):
        raise StepError(
            f"ctx.db_writes({name!r}) takes a list of (sql, parameters) pairs, not "
            f"{type(statements).__name__}"
        )
    if not statements:
        raise StepError(f"ctx.db_writes({name!r}) was given no statement to run")
    writes = []
    for index, pair in enumerate(statements):
        if not isinstance(pair, tuple | list) or len(pair) != 2:
            raise StepError(
                f"ctx.db_writes({name!r}) statement {index} must be a (sql, parameters) pair, "
                f"not {pair!r:.80}"
            )
        query, params = pair
        if not isinstance(query, str) and not hasattr(query, "as_string"):  # psycopg's sql
            raise StepError(
                f"ctx.db_writes({name!r}) statement {index}: the SQL must be text, not "
                f"{type(query).__name__}"
            )
        if params is not None and (
            isinstance(params, str | bytes) or not isinstance(params, Sequence | Mapping)
        ):
            raise StepError(
                f"ctx.db_writes({name!r}) statement {index}: parameters must be None, a "
                f"sequence or a mapping, not {type(params).__name__}"
            )
        writes.append((query, params))
    return writes
