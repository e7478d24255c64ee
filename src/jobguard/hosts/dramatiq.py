"""Guard Dramatiq actors: Dramatiq keeps its broker, workers and middleware; jobguard keeps the
promise.

::

    import jobguard
    from dramatiq.brokers.redis import RedisBroker
    from jobguard.hosts.dramatiq import DramatiqGuard

    broker = RedisBroker(url="redis://127.0.0.1:6379/0")
    guard = DramatiqGuard(broker, jobguard.App("postgresql://app@db/shop"))

    @guard.actor(operation_key="fulfil-order:{order_id}", resource_key="order:{order_id}")
    def fulfil_order(ctx, order_id): ...

    fulfil_order.send(order_id=42)   # a Dramatiq actor as before

A delivery handed back (the operation is held by a live delivery, or its resource is busy) and
a transient failure both raise ``dramatiq.Retry(delay=...)``, which Dramatiq's ``Retries``
middleware requeues; the actor gets ``max_retries=None`` because jobguard counts attempts. A
buried job raises :class:`DeadLettered`, which the actor ``throws`` (failed, not retried).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

try:
    import dramatiq
    from dramatiq.middleware import CurrentMessage, Retries, TimeLimit
except ImportError as exc:  # the host is an optional extra
    raise ImportError(
        f"jobguard.hosts.dramatiq needs Dramatiq: pip install 'jobguard[dramatiq]' ({exc})"
    ) from exc

from jobguard.app import App
from jobguard.exceptions import ConfigurationError
from jobguard.hosts.guard import GUARD_OPTIONS, HostGuard, Verdict

MAX_HAND_BACK_S = 60.0
REFUSED = {
    "max_retries": "jobguard counts attempts (max_attempts=)",
    "retry_when": "jobguard classifies errors (transient=, fatal=)",
    "throws": "jobguard classifies errors (fatal=)",
    "min_backoff": "jobguard's backoff applies (backoff_base_s=)",
    "max_backoff": "jobguard's backoff applies (backoff_cap_s=)",
}


class DeadLettered(Exception):
    """Raised to Dramatiq for a job jobguard buried: the message fails (replay resends it)."""


class GuardedActor(dramatiq.Actor[..., None]):
    """A guarded actor: sending checks the arguments and deduplicates if asked."""

    jobguard_guard: DramatiqGuard
    jobguard_name: str

    def send_with_options(
        self,
        *,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        delay: Any = None,
        **options: Any,
    ) -> Any:
        """Send as Dramatiq does, after the guard checked the arguments (no I/O); with
        ``dedup=True`` on the actor, nothing is sent (``None`` is returned) while the
        operation's job is queued or running."""
        guard, name = self.jobguard_guard, self.jobguard_name
        arguments = guard.arguments(name, tuple(args), kwargs or {})
        guard.spec(name, arguments)  # refused here, not in the worker
        if guard.dedup[name]:
            message_id = str(uuid.uuid4())
            if guard.reserve(name, arguments, host_id=message_id).deduplicated:
                return None
            options["message_id"] = message_id
        return self.resend(arguments, delay=delay, **options)

    def resend(self, arguments: dict[str, Any], *, delay: Any = None, **options: Any) -> Any:
        """Send without the producer's dedup (a replayed job, already queued in the store)."""
        message_id = options.pop("message_id", None)
        message = self.message_with_options(kwargs=arguments, **options)
        if message_id is not None:
            message = message.copy(message_id=message_id)
        return self.broker.enqueue(message, delay=delay)


class DramatiqGuard(HostGuard):
    """The guard for the actors of one Dramatiq broker.

    Args:
        broker: The Dramatiq broker; it must have the ``Retries`` middleware (a default
            broker has it). ``CurrentMessage`` is added if missing (the guard records each
            message's id on its attempt).
        store: The jobguard store (``jobguard.App(url)``); opened once here, so an unreachable
            store fails at import, not at the first message.
    """

    def __init__(self, broker: dramatiq.Broker, store: App) -> None:
        if not isinstance(broker, dramatiq.Broker):
            raise ConfigurationError(f"DramatiqGuard needs a dramatiq.Broker, not {broker!r}")
        kinds = {type(middleware) for middleware in broker.middleware}
        if Retries not in kinds:
            raise ConfigurationError(
                "the broker has no Retries middleware: a handed-back or retried message would "
                "be dropped; add dramatiq.middleware.Retries() to the broker"
            )
        if CurrentMessage not in kinds:
            broker.add_middleware(CurrentMessage())
        super().__init__("dramatiq", store, max_hand_back_s=MAX_HAND_BACK_S)
        self.broker = broker

    def actor(self, **options: Any) -> Callable[[Callable[..., Any]], GuardedActor]:
        """Make a guarded Dramatiq actor of ``fn(ctx, ...)``; jobguard's options as in
        :meth:`jobguard.hosts.celery.CeleryGuard.task` (``operation_key`` is required), the
        others go to ``dramatiq.actor`` (``queue_name``, ``time_limit``...)."""
        guard_options = {k: v for k, v in options.items() if k in GUARD_OPTIONS}
        host_options = {k: v for k, v in options.items() if k not in GUARD_OPTIONS}
        for option, why in REFUSED.items():
            if option in host_options:
                raise ConfigurationError(f"guarded Dramatiq actor: {option}= is refused: {why}")

        def register(fn: Callable[..., Any]) -> GuardedActor:
            name = guard_options.pop("name", None) or f"{fn.__module__}.{fn.__qualname__}"
            limit = self.time_limit_s(host_options.get("time_limit"))
            self.define(fn, name, guard_options, host_timeout_s=limit)

            def run(*args: Any, **kwargs: Any) -> None:
                self._deliver(name, args, kwargs)

            run.__name__, run.__qualname__ = fn.__name__, fn.__qualname__
            run.__module__, run.__doc__ = fn.__module__, fn.__doc__
            make = dramatiq.actor(
                actor_class=GuardedActor,
                actor_name=name,
                broker=self.broker,
                max_retries=None,
                throws=(DeadLettered,),
                **host_options,
            )
            actor = make(run)
            assert isinstance(actor, GuardedActor)
            actor.jobguard_guard = self
            actor.jobguard_name = name
            self.on_replay(name, actor.resend)
            return actor

        return register

    def time_limit_s(self, given_ms: Any) -> float | None:
        """The time limit of an actor (its own ``time_limit``, else the broker's ``TimeLimit``
        middleware's), in seconds; ``None`` when nothing limits it."""
        if given_ms is None:
            limits = [m for m in self.broker.middleware if isinstance(m, TimeLimit)]
            given_ms = limits[0].time_limit if limits else None
        if given_ms is None:
            return None
        if not isinstance(given_ms, int | float) or isinstance(given_ms, bool) or given_ms <= 0:
            raise ConfigurationError(
                f"time_limit must be a positive number of milliseconds, not {given_ms!r}"
            )
        return given_ms / 1000.0

    def _deliver(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        arguments = self.arguments(name, args, kwargs)
        message = CurrentMessage.get_current_message()
        retries = message.options.get("retries", 0) if message is not None else 0
        delivery = f"{message.message_id}#{retries}" if message else f"direct-{uuid.uuid4()}"
        given = message.options.get("time_limit") if message is not None else None
        limit = self.time_limit_s(given) if given is not None else None
        verdict = self.run(name, arguments, delivery, host_timeout_s=limit)
        if verdict.verdict == Verdict.ACK:
            return
        if verdict.verdict == Verdict.DEAD:
            raise DeadLettered(f"jobguard job {verdict.job_id}: {verdict.reason}")
        raise dramatiq.Retry(verdict.reason, delay=max(1, int(verdict.delay_s * 1000)))
