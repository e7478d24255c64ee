"""Retry decisions: classify an error, compute full-jitter backoff, spot poison (R6, R7.2).

Everything here is a pure function over values; the worker carries the decision out.
"""

from __future__ import annotations

import hashlib
import random
import traceback
from dataclasses import dataclass
from enum import StrEnum

from jobguard.exceptions import Fatal, GuardLost, HandlerDecision, Retry
from jobguard.models import DeadCode


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How a task retries.

    Attributes:
        max_attempts: Deliveries allowed in total, counted at delivery (a crash counts).
        backoff_base_s: First retry waits up to this long (full jitter).
        backoff_cap_s: No retry waits longer than this.
        fatal: Exception classes that go to the dead letter queue at once.
        transient: If set, only these (and ``Retry``) are retried; others are fatal.
        poison_threshold: The same error signature this many times in a row buries the job early.
    """

    max_attempts: int = 5
    backoff_base_s: float = 1.0
    backoff_cap_s: float = 300.0
    fatal: tuple[type[BaseException], ...] = ()
    transient: tuple[type[BaseException], ...] | None = None
    poison_threshold: int = 3

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be >= 1")
        if self.backoff_base_s < 0 or self.backoff_cap_s < 0:
            raise ValueError("backoff_base_s and backoff_cap_s must be >= 0")
        if self.poison_threshold < 2:
            raise ValueError("poison_threshold must be >= 2")


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
    if isinstance(exc, Fatal):
        return True
    # Fatal was handled above: any other decision (Retry) asks for a retry, whatever the policy.
    if isinstance(exc, HandlerDecision | GuardLost):
        return False
    if policy.fatal and isinstance(exc, policy.fatal):
        return True
    if policy.transient is not None:
        return not isinstance(exc, policy.transient)
    return False


def error_signature(exc: BaseException) -> str:
    """A short stable hash of the error's type and the code locations of its traceback.

    The message is left out on purpose: ids and timestamps in messages would make the same
    deterministic bug look different each time (R8.4).
    """
    frames = traceback.extract_tb(exc.__traceback__)
    parts = [type(exc).__module__ + "." + type(exc).__qualname__]
    parts.extend(f"{frame.filename}:{frame.name}:{frame.lineno}" for frame in frames)
    return hashlib.blake2b("\n".join(parts).encode(), digest_size=8).hexdigest()


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
        return Decision(Verdict.DEAD, reason=f"fatal error: {name}: {exc}", code=DeadCode.FATAL)
    if attempt >= policy.max_attempts:
        return Decision(
            Verdict.DEAD,
            reason=f"attempts exhausted ({attempt}/{policy.max_attempts}): {name}",
            code=DeadCode.EXHAUSTED,
        )
    if not isinstance(exc, Retry) and same_signature_count >= policy.poison_threshold:
        return Decision(
            Verdict.DEAD,
            reason=f"poison: the same {name} {same_signature_count} times in a row",
            code=DeadCode.POISON,
        )
    if isinstance(exc, Retry) and exc.delay_s is not None:
        return Decision(Verdict.RETRY, delay_s=exc.delay_s, reason=str(exc))
    delay = full_jitter_s(attempt, policy.backoff_base_s, policy.backoff_cap_s, rng)
    return Decision(Verdict.RETRY, delay_s=delay, reason=f"{name}: {exc}")


def deferral_delay_s(deferrals: int, rng: random.Random, cap_s: float = 5.0) -> float:
    """Delay before retrying a job whose resource was busy: short, jittered, capped.

    Lock-busy is expected contention, not failure, so the curve starts small (50 ms).
    """
    return full_jitter_s(deferrals + 1, 0.05, cap_s, rng) + 0.01
