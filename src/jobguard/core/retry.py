"""Retry decisions: classify an error, compute full-jitter backoff, spot poison (G7, G8).

Everything here is a pure function over values; the worker carries the decision out. The rule,
stated once for users in ``docs/concepts.md`` ("What is retried"):

1. :class:`~jobguard.Fatal`, a class in the task's ``fatal``, a
   :class:`~jobguard.ConfigurationError` raised while the handler runs (a mistake in the task
   itself, e.g. ``ctx.step`` without an operation key) and, when ``transient`` is given,
   anything outside it: dead at once.
2. Declared errors (:class:`~jobguard.Retry`, a class in ``transient``, and the standard
   library's outage errors ``ConnectionError`` and ``TimeoutError``) are retried up to
   ``max_attempts``, however often the same error repeats.
3. Any other error is retried too, until the same signature repeats ``poison_threshold`` times
   in a row (poison: a deterministic bug), or ``max_attempts`` is spent.
4. A crash loop (a job that kills its worker) is bounded by ``max_attempts``, charged at
   delivery.
"""

from __future__ import annotations

import hashlib
import random
import traceback
from dataclasses import dataclass
from enum import StrEnum

from jobguard.core import checks
from jobguard.core.text import describe
from jobguard.exceptions import ConfigurationError, Fatal, GuardLost, HandlerDecision, Retry
from jobguard.models import DeadCode

# Errors of an outage rather than of the job: retried up to max_attempts, never taken for poison.
OUTAGE_ERRORS: tuple[type[BaseException], ...] = (ConnectionError, TimeoutError)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How a task retries.

    Attributes:
        max_attempts: Deliveries allowed in total, counted at delivery (a crash counts).
        backoff_base_s: First retry waits up to this long (full jitter).
        backoff_cap_s: No retry waits longer than this.
        fatal: Exception classes that go to the dead letter queue at once.
        transient: Errors declared transient: retried up to ``max_attempts`` and never taken for
            poison. If set, only these (and ``Retry``) are retried; others are fatal.
        poison_threshold: The same undeclared error signature this many times in a row buries
            the job early.
    """

    max_attempts: int = 5
    backoff_base_s: float = 1.0
    backoff_cap_s: float = 300.0
    fatal: tuple[type[BaseException], ...] = ()
    transient: tuple[type[BaseException], ...] | None = None
    poison_threshold: int = 3

    def __post_init__(self) -> None:
        """Check every field (raises :class:`~jobguard.ConfigurationError` naming it)."""
        set_field = object.__setattr__  # frozen: normalise in place once, here
        set_field(self, "max_attempts", checks.count("max_attempts", self.max_attempts))
        set_field(self, "backoff_base_s", checks.seconds("backoff_base_s", self.backoff_base_s))
        set_field(self, "backoff_cap_s", checks.seconds("backoff_cap_s", self.backoff_cap_s))
        set_field(self, "fatal", checks.exception_classes("fatal", self.fatal))
        if self.transient is not None:
            set_field(self, "transient", checks.exception_classes("transient", self.transient))
        set_field(
            self, "poison_threshold", checks.count("poison_threshold", self.poison_threshold, 2)
        )


class Verdict(StrEnum):
    """What happens to a failed delivery."""

    RETRY = "retry"
    DEAD = "dead"


@dataclass(frozen=True, slots=True)
class Decision:
    """A retry decision: retry after ``delay_s``, or bury with ``reason``."""

    verdict: Verdict
    delay_s: float = 0.0
    reason: str = ""
    code: DeadCode | None = None


def backoff_ceiling_s(attempt: int, base_s: float, cap_s: float) -> float:
    """Upper bound of the delay before the retry that follows ``attempt`` (1-based)."""
    exponent = min(max(attempt - 1, 0), 62)  # 2**62 * base already exceeds any sane cap
    return float(min(cap_s, base_s * (2**exponent)))


def full_jitter_s(attempt: int, base_s: float, cap_s: float, rng: random.Random) -> float:
    """Full-jitter exponential backoff: uniform in ``[0, min(cap, base * 2**(attempt-1))]``."""
    return rng.uniform(0.0, backoff_ceiling_s(attempt, base_s, cap_s))


def is_fatal(exc: BaseException, policy: RetryPolicy) -> bool:
    """Classify an exception raised by a handler as fatal (never retried) or transient."""
    if isinstance(exc, Fatal | ConfigurationError):
        # A mistake in the task itself: every rerun would repeat it.
        return True
    # Fatal was handled above: any other decision (Retry) asks for a retry, whatever the policy.
    if isinstance(exc, HandlerDecision | GuardLost):
        return False
    if policy.fatal and isinstance(exc, policy.fatal):
        return True
    if policy.transient is not None:
        return not isinstance(exc, policy.transient)
    return False


def is_declared(exc: BaseException, policy: RetryPolicy) -> bool:
    """Whether ``exc`` is an error the task expects to pass: never taken for poison."""
    if isinstance(exc, (Retry, *OUTAGE_ERRORS)):
        return True
    return policy.transient is not None and isinstance(exc, policy.transient)


def error_signature(exc: BaseException) -> str:
    """A short stable hash of the error's type and the code locations of its traceback.

    The message is left out on purpose: ids and timestamps in messages would make the same
    deterministic bug look different each time (G10.4).
    """
    frames = traceback.extract_tb(exc.__traceback__)
    parts = [type(exc).__module__ + "." + type(exc).__qualname__]
    parts.extend(f"{frame.filename}:{frame.name}:{frame.lineno}" for frame in frames)
    return hashlib.blake2b(
        "\n".join(parts).encode("utf-8", "surrogatepass"), digest_size=8
    ).hexdigest()


def decide(
    exc: BaseException,
    *,
    attempt: int,
    policy: RetryPolicy,
    same_signature_count: int,
    rng: random.Random,
) -> Decision:
    """Decide what happens after ``exc`` ended delivery number ``attempt``.

    Args:
        exc: What the handler raised.
        attempt: The 1-based delivery number that just failed (already charged).
        policy: The task's retry policy.
        same_signature_count: How many failures in a row, this one included, share its signature.
        rng: Source of jitter (seeded in tests).
    """
    name = type(exc).__name__
    if is_fatal(exc, policy):
        return Decision(
            Verdict.DEAD, reason=f"fatal error: {name}: {describe(exc)}", code=DeadCode.FATAL
        )
    if attempt >= policy.max_attempts:
        return Decision(
            Verdict.DEAD,
            reason=f"attempts exhausted ({attempt}/{policy.max_attempts}): {name}",
            code=DeadCode.EXHAUSTED,
        )
    if not is_declared(exc, policy) and same_signature_count >= policy.poison_threshold:
        return Decision(
            Verdict.DEAD,
            reason=f"poison: the same {name} {same_signature_count} times in a row",
            code=DeadCode.POISON,
        )
    if isinstance(exc, Retry) and exc.delay_s is not None:
        return Decision(Verdict.RETRY, delay_s=exc.delay_s, reason=describe(exc))
    delay = full_jitter_s(attempt, policy.backoff_base_s, policy.backoff_cap_s, rng)
    return Decision(Verdict.RETRY, delay_s=delay, reason=f"{name}: {describe(exc)}")


def deferral_delay_s(deferrals: int, rng: random.Random, cap_s: float = 5.0) -> float:
    """Delay before retrying a job whose resource was busy: short, jittered, capped.

    Lock-busy is expected contention, not failure, so the curve starts small (50 ms).
    """
    return full_jitter_s(deferrals + 1, 0.05, cap_s, rng) + 0.01
