"""Unit tests of the pure retry decisions in ``jobguard.core.retry`` (G7, G8.2)."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jobguard.core.retry import (
    RetryPolicy,
    Verdict,
    backoff_ceiling_s,
    decide,
    deferral_delay_s,
    error_signature,
    full_jitter_s,
    is_fatal,
)
from jobguard.exceptions import ConfigurationError, Fatal, LeaseLostError, Retry, StaleFenceError

PROPERTY_SETTINGS = settings(max_examples=300, derandomize=True, database=None)


def decide_for(
    exc: BaseException, *, attempt: int = 1, same: int = 1, **policy: Any
) -> tuple[Verdict, float, str]:
    """Run :func:`decide` with a seeded RNG and return the decision's fields."""
    decision = decide(
        exc,
        attempt=attempt,
        policy=RetryPolicy(**policy),
        same_signature_count=same,
        rng=random.Random(7),
    )
    return decision.verdict, decision.delay_s, decision.reason


def raised(exc: BaseException) -> BaseException:
    """``exc`` with a traceback, as a handler would have raised it."""
    try:
        raise exc
    except BaseException as caught:
        return caught


# -- classification (G7.1) ----------------------------------------------------------------------


def test_an_exception_of_a_configured_fatal_class_goes_dead_at_once() -> None:
    """G7.1, G8.1: ``fatal=(ValueError,)`` buries on the first attempt, subclasses included."""

    class BadOrder(ValueError):
        pass

    verdict, _, reason = decide_for(BadOrder("no such sku"), fatal=(ValueError,))
    assert verdict is Verdict.DEAD
    assert reason == "fatal error: BadOrder: no such sku"


def test_raising_fatal_buries_even_with_attempts_left() -> None:
    """G7.1: ``jobguard.Fatal`` is the handler's explicit 'do not retry'."""
    verdict, _, reason = decide_for(Fatal("card declined"), attempt=1, max_attempts=10)
    assert verdict is Verdict.DEAD
    assert "card declined" in reason


def test_an_unclassified_exception_is_transient_and_retried() -> None:
    """G7.1: by default an error is assumed transient (network, timeouts)."""
    verdict, delay_s, _ = decide_for(ConnectionError("reset"), attempt=1, backoff_base_s=2.0)
    assert verdict is Verdict.RETRY
    assert 0.0 <= delay_s <= 2.0


def test_with_a_transient_list_anything_else_is_fatal() -> None:
    """G7.1: ``transient=(TimeoutError,)`` retries only those (and Retry); others are fatal."""
    policy = RetryPolicy(transient=(TimeoutError,))
    assert is_fatal(KeyError("x"), policy) is True
    assert is_fatal(TimeoutError(), policy) is False
    assert is_fatal(Retry(), policy) is False


def test_guard_lost_is_never_classified_fatal() -> None:
    """G2.4, G3.5: a lost lease or fence is not the job's fault; it must not bury the job."""
    policy = RetryPolicy(fatal=(Exception,))
    assert is_fatal(LeaseLostError("stale"), policy) is False
    assert is_fatal(StaleFenceError("stale"), policy) is False


def test_retry_with_delay_s_uses_that_delay_exactly() -> None:
    """G7.2: ``raise Retry(delay_s=5)`` overrides the backoff."""
    verdict, delay_s, _ = decide_for(Retry("rate limited", delay_s=5.0), backoff_cap_s=1.0)
    assert (verdict, delay_s) == (Verdict.RETRY, 5.0)


def test_retry_without_delay_uses_the_backoff() -> None:
    """G7.2: a bare ``Retry()`` is jittered like any transient error."""
    verdict, delay_s, _ = decide_for(Retry(), attempt=3, backoff_base_s=1.0, backoff_cap_s=100.0)
    assert verdict is Verdict.RETRY
    assert 0.0 <= delay_s <= 4.0


@pytest.mark.parametrize("delay_s", [-1.0, math.nan, math.inf, True, "5"])
def test_retry_rejects_a_delay_that_cannot_work(delay_s: Any) -> None:
    """A negative, NaN, infinite or non-numeric explicit delay is a mistake in the task, caught
    where it is made: a ConfigurationError, which the pipeline buries at once (never stranded).
    """
    with pytest.raises(ConfigurationError, match=r"Retry\(delay_s=\.\.\.\)"):
        Retry(delay_s=delay_s)


# -- attempts and poison (G7.2, G8.2) -----------------------------------------------------------


@pytest.mark.parametrize("exc", [ConnectionError("reset"), Retry(delay_s=1.0), Retry()])
def test_the_last_allowed_attempt_goes_dead_whatever_was_raised(exc: BaseException) -> None:
    """G7.2, G8.1: attempts exhausted buries, even when the handler asked for a retry."""
    verdict, _, reason = decide_for(exc, attempt=3, max_attempts=3)
    assert verdict is Verdict.DEAD
    assert reason.startswith("attempts exhausted (3/3)")


def test_the_same_error_signature_n_times_in_a_row_is_poison() -> None:
    """G8.2: at ``poison_threshold`` repeats of one signature the job is buried early."""
    exc = KeyError("missing")
    below = decide_for(exc, attempt=2, same=2, max_attempts=10, poison_threshold=3)
    at = decide_for(exc, attempt=3, same=3, max_attempts=10, poison_threshold=3)
    assert below[0] is Verdict.RETRY
    assert at[0] is Verdict.DEAD
    assert at[2] == "poison: the same KeyError 3 times in a row"


def test_an_explicit_retry_is_never_poison() -> None:
    """G8.2: a handler that asks to be retried is not a crash loop, however often it asks."""
    verdict, _, _ = decide_for(Retry(), attempt=5, same=5, max_attempts=10, poison_threshold=2)
    assert verdict is Verdict.RETRY


@pytest.mark.parametrize(
    "policy",
    [
        {"max_attempts": 0},
        {"backoff_base_s": -1.0},
        {"backoff_cap_s": -0.5},
        {"poison_threshold": 1},
    ],
)
def test_retry_policy_refuses_values_that_cannot_work(policy: dict[str, Any]) -> None:
    """G7.2: a policy with no attempts, negative delays or a one-shot poison rule is refused."""
    with pytest.raises(ConfigurationError, match=next(iter(policy))):
        RetryPolicy(**policy)


# -- backoff (G7.2) -----------------------------------------------------------------------------


def test_backoff_ceiling_doubles_from_the_base_and_stops_at_the_cap() -> None:
    """G7.2: the ceiling is ``min(cap, base * 2**(n-1))``."""
    ceilings = [backoff_ceiling_s(n, 1.0, 30.0) for n in range(1, 8)]
    assert ceilings == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert backoff_ceiling_s(10_000, 1.0, 300.0) == 300.0  # no overflow on huge attempt numbers


@PROPERTY_SETTINGS
@given(
    attempt=st.integers(min_value=1, max_value=10_000),
    base_s=st.floats(min_value=0.0, max_value=60.0),
    cap_s=st.floats(min_value=0.0, max_value=3600.0),
    seed=st.integers(min_value=0, max_value=2**32 - 1),
)
def test_full_jitter_backoff_is_always_within_zero_and_the_capped_ceiling(
    attempt: int, base_s: float, cap_s: float, seed: int
) -> None:
    """G7.2, : every delay lies in ``[0, min(cap, base * 2**(n-1))]``."""
    delay_s = full_jitter_s(attempt, base_s, cap_s, random.Random(seed))
    assert 0.0 <= delay_s <= min(cap_s, base_s * 2.0 ** min(attempt - 1, 1000))


@PROPERTY_SETTINGS
@given(
    attempt=st.integers(min_value=1, max_value=50),
    max_attempts=st.integers(min_value=1, max_value=50),
    seed=st.integers(min_value=0, max_value=2**32 - 1),
)
def test_decide_retries_only_before_the_last_attempt_and_within_the_bounds(
    attempt: int, max_attempts: int, seed: int
) -> None:
    """G7.2: a transient error retries iff attempts remain, with a delay inside the bounds."""
    policy = RetryPolicy(max_attempts=max_attempts, backoff_base_s=0.5, backoff_cap_s=20.0)
    decision = decide(
        ConnectionError("reset"),
        attempt=attempt,
        policy=policy,
        same_signature_count=1,
        rng=random.Random(seed),
    )
    if attempt >= max_attempts:
        assert decision.verdict is Verdict.DEAD
    else:
        assert decision.verdict is Verdict.RETRY
        assert 0.0 <= decision.delay_s <= min(20.0, 0.5 * 2 ** (attempt - 1))


def test_full_jitter_spreads_over_the_whole_range() -> None:
    """G7.2: full jitter, not 'equal jitter': delays use the bottom and top of the range."""
    rng = random.Random(1)
    delays = [full_jitter_s(4, 1.0, 300.0, rng) for _ in range(2000)]
    assert min(delays) < 0.5
    assert max(delays) > 7.5


@PROPERTY_SETTINGS
@given(deferrals=st.integers(min_value=0, max_value=1000), seed=st.integers(0, 2**32 - 1))
def test_deferral_delay_is_short_positive_and_capped(deferrals: int, seed: int) -> None:
    """G3.4: a busy resource is retried soon (never at once, never later than the cap)."""
    delay_s = deferral_delay_s(deferrals, random.Random(seed), cap_s=5.0)
    assert 0.0 < delay_s <= 5.0 + 0.01


# -- error signatures (G8.2, G10.4) --------------------------------------------------------------


def _fail_here(message: str) -> None:
    raise KeyError(message)


def _fail_there(message: str) -> None:
    raise KeyError(message)


def _caught(fn: Callable[[str], None], message: str) -> BaseException:
    try:
        fn(message)
    except KeyError as exc:
        return exc
    raise AssertionError("did not raise")


def test_error_signature_ignores_the_message_but_not_the_location_or_type() -> None:
    """G8.2, G10.4: ids in messages do not hide a repeating bug; a different bug differs."""
    first = error_signature(_caught(_fail_here, "order 1"))
    assert first == error_signature(_caught(_fail_here, "order 2"))
    assert first != error_signature(_caught(_fail_there, "order 1"))
    assert error_signature(raised(KeyError("a"))) != error_signature(raised(ValueError("a")))
