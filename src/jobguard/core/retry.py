"""Retry decisions: classify an error, compute full-jitter backoff, spot poison (G7, G8).

Everything here is a pure function over values; the worker carries the decision out. The rule,
stated once for users in ``docs/concepts.md`` ("What is retried"):

0. A failure of jobguard's own store, or of the connection a ``db_step`` runs on
   (:class:`~jobguard.StoreUnavailableError`; drivers classify their errors at the backend
   edge), is an outage: retried up to ``max_attempts``, never fatal, never poison, whatever the
   task's ``fatal`` and ``transient`` say.
1. :class:`~jobguard.Fatal`, a class in the task's ``fatal``, a
   :class:`~jobguard.ConfigurationError` raised while the handler runs (a mistake in the task
   itself, e.g. ``ctx.step`` without an operation key) and, when ``transient`` is given,
   anything outside it and outside the built-in outage errors: dead at once.
2. Declared errors (:class:`~jobguard.Retry`, the standard library's outage errors
   ``ConnectionError`` and ``TimeoutError``, and a class in ``transient``, which adds to them)
   are retried up to ``max_attempts``, however often the same error repeats.
3. Any other error is retried too, and is poison (a deterministic bug, buried early) only when
   its own repeated failure stands out: the same signature ``poison_threshold`` times in a
   row, spread over at least the backoff those retries allow (:func:`poison_span_s`), while no
   other job of the task failed the same way in that time (then it is an outage).
4. A crash loop (a job that kills its worker) is bounded by ``max_attempts``, charged at
   delivery.
"""

from __future__ import annotations

import hashlib
import random
import traceback
from dataclasses import dataclass
from enum import StrEnum

from jobguard.core import checks, messages
from jobguard.core.text import describe
from jobguard.exceptions import (
    ConfigurationError,
    Fatal,
    GuardLost,
    HandlerDecision,
    Retry,
    StoreUnavailableError,
    TimeLimitExceeded,
)
from jobguard.models import DeadCode

# Errors of an outage rather than of the job: retried up to max_attempts, never taken for poison.
# ``transient=`` adds to these; it never replaces them.
OUTAGE_ERRORS: tuple[type[BaseException], ...] = (ConnectionError, TimeoutError)
# jobguard's own store (or a db_step's connection to it) failing: above every task option.
STORE_OUTAGES: tuple[type[BaseException], ...] = (StoreUnavailableError,)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How a task retries.

    Attributes:
        max_attempts: Deliveries allowed in total, counted at delivery (a crash counts).
        backoff_base_s: First retry waits up to this long (full jitter).
        backoff_cap_s: No retry waits longer than this.
        fatal: Exception classes that go to the dead letter queue at once.
        transient: Errors declared transient, in addition to the built-in outage errors
            (``ConnectionError``, ``TimeoutError``, store outages): retried up to
            ``max_attempts`` and never taken for poison. If set, any other error is fatal.
        poison_threshold: The same undeclared error signature this many times in a row buries
            the job early, when it stands out (see :func:`decide`).
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
class FailureHistory:
    """What the attempt log says of a repeated failure; read only when it may be poison.

    Attributes:
        streak_span_s: Store-clock seconds since the first failure of the streak began.
        peers_failing: Other jobs of the same task whose attempts failed with the same error
            type within that span.
    """

    streak_span_s: float
    peers_failing: int


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


def is_outage(exc: BaseException) -> bool:
    """Whether ``exc`` is an outage: jobguard's store, or a built-in network/timeout error."""
    return isinstance(exc, STORE_OUTAGES + OUTAGE_ERRORS)


def is_fatal(exc: BaseException, policy: RetryPolicy) -> bool:
    """Classify an exception raised by a handler as fatal (never retried) or transient."""
    if isinstance(exc, STORE_OUTAGES):
        return False  # the store failed, not the job: whatever the task declared
    if isinstance(exc, Fatal | ConfigurationError):
        # A mistake in the task itself: every rerun would repeat it.
        return True
    # Fatal was handled above: any other decision (Retry) asks for a retry, whatever the policy;
    # a run past its soft time limit is a transient failure (its steps are kept).
    if isinstance(exc, HandlerDecision | GuardLost | TimeLimitExceeded):
        return False
    if policy.fatal and isinstance(exc, policy.fatal):
        return True
    if policy.transient is not None:
        return not isinstance(exc, (*OUTAGE_ERRORS, *policy.transient))
    return False


def is_declared(exc: BaseException, policy: RetryPolicy) -> bool:
    """Whether ``exc`` is an error the task expects to pass: never taken for poison."""
    if isinstance(exc, (Retry, *STORE_OUTAGES, *OUTAGE_ERRORS)):
        return True
    return policy.transient is not None and isinstance(exc, policy.transient)


def poison_span_s(policy: RetryPolicy) -> float:
    """How long a streak of one error must last before it may be poison: the backoff ceilings
    of its retries summed (1 + 2 + 4 s for the default policy), so an error that clears up
    when retried later is never buried on failures that came close together by jitter."""
    return sum(
        backoff_ceiling_s(attempt, policy.backoff_base_s, policy.backoff_cap_s)
        for attempt in range(1, policy.poison_threshold + 1)
    )


def needs_history(exc: BaseException, *, attempt: int, policy: RetryPolicy, same: int) -> bool:
    """Whether :func:`decide` needs a :class:`FailureHistory` for this failure (may be poison)."""
    return (
        not is_fatal(exc, policy)
        and attempt < policy.max_attempts
        and not is_declared(exc, policy)
        and same >= policy.poison_threshold
    )


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
    history: FailureHistory | None = None,
) -> Decision:
    """Decide what happens after ``exc`` ended delivery number ``attempt``.

    Args:
        exc: What the handler raised.
        attempt: The 1-based delivery number that just failed (already charged).
        policy: The task's retry policy.
        same_signature_count: How many failures in a row, this one included, share its signature.
        rng: Source of jitter (seeded in tests).
        history: The streak's span and its peers (when :func:`needs_history`); without it, the
            count alone decides poison.
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
    delay = full_jitter_s(attempt, policy.backoff_base_s, policy.backoff_cap_s, rng)
    if needs_history(exc, attempt=attempt, policy=policy, same=same_signature_count):
        return _repeated(exc, policy, same_signature_count, history, delay)
    if isinstance(exc, Retry) and exc.delay_s is not None:
        return Decision(Verdict.RETRY, delay_s=exc.delay_s, reason=describe(exc))
    return Decision(Verdict.RETRY, delay_s=delay, reason=f"{name}: {describe(exc)}")


def _repeated(
    exc: BaseException,
    policy: RetryPolicy,
    same: int,
    history: FailureHistory | None,
    delay_s: float,
) -> Decision:
    """The same undeclared error ``same`` times in a row: poison only if it stands out."""
    name = type(exc).__name__
    if history is not None and history.peers_failing > 0:
        # Not this job's own failure: the task's other jobs fail the same way (an outage).
        reason = messages.shared_failure(name, describe(exc), history.peers_failing)
        return Decision(Verdict.RETRY, delay_s=delay_s, reason=reason)
    needed_s = poison_span_s(policy)
    if history is not None and history.streak_span_s < needed_s:
        # Close together by jitter: wait out the backoff it skipped, then judge again.
        wait_s = max(delay_s, needed_s - history.streak_span_s)
        return Decision(Verdict.RETRY, delay_s=wait_s, reason=f"{name}: {describe(exc)}")
    return Decision(
        Verdict.DEAD,
        reason=f"poison: the same {name} {same} times in a row",
        code=DeadCode.POISON,
    )


def deferral_delay_s(deferrals: int, rng: random.Random, cap_s: float = 5.0) -> float:
    """Delay before retrying a job whose resource was busy: short, jittered, capped.

    Lock-busy is expected contention, not failure, so the curve starts small (50 ms).
    """
    return full_jitter_s(deferrals + 1, 0.05, cap_s, rng) + 0.01
