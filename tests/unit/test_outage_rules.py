"""Unit tests of the outage and poison rules of ``jobguard.core.retry`` (#18).

An outage never buries work: jobguard's own store failing is retried whatever the task's
``transient=``/``fatal=`` say, ``transient=`` adds to the built-in outage errors, and a job is
poison only when its own repeated failure stands out from the rest of its task.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from jobguard.core.retry import (
    FailureHistory,
    RetryPolicy,
    Verdict,
    decide,
    is_declared,
    is_fatal,
    is_outage,
    needs_history,
    poison_span_s,
)
from jobguard.exceptions import StepSQLError, StoreBrokenError, StoreUnavailableError


class MailAPIError(Exception):
    """What an HTTP client raises for a 503: undeclared, like httpx's HTTPStatusError."""


def decision(
    exc: BaseException,
    *,
    attempt: int = 1,
    same: int = 1,
    history: FailureHistory | None = None,
    **policy: Any,
) -> tuple[Verdict, float, str]:
    """:func:`decide` with a seeded RNG; the decision's fields."""
    made = decide(
        exc,
        attempt=attempt,
        policy=RetryPolicy(**policy),
        same_signature_count=same,
        rng=random.Random(3),
        history=history,
    )
    return made.verdict, made.delay_s, made.reason


STORE_OUTAGES = [
    StoreUnavailableError("PostgreSQL write failed: terminating connection"),
    StoreBrokenError("the SQLite file was replaced"),
]


@pytest.mark.parametrize("exc", STORE_OUTAGES)
@pytest.mark.parametrize(
    "policy",
    [{}, {"transient": (MailAPIError,)}, {"fatal": (Exception,)}, {"transient": (ValueError,)}],
)
def test_a_store_outage_is_retried_whatever_transient_and_fatal_say(
    exc: BaseException, policy: dict[str, Any]
) -> None:
    """A failure of jobguard's own store is never fatal, whatever the task declared."""
    verdict, _, _ = decision(exc, attempt=1, max_attempts=5, **policy)
    assert verdict is Verdict.RETRY
    assert is_outage(exc)
    assert not is_fatal(exc, RetryPolicy(**policy))


@pytest.mark.parametrize("exc", STORE_OUTAGES)
def test_a_store_outage_is_never_poison(exc: BaseException) -> None:
    """Three (or nine) store outages in a row are an outage, not a deterministic bug."""
    verdict, _, _ = decision(exc, attempt=9, same=9, max_attempts=10, poison_threshold=3)
    assert verdict is Verdict.RETRY
    assert not needs_history(exc, attempt=9, policy=RetryPolicy(max_attempts=10), same=9)


def test_user_sql_errors_stay_what_they_are() -> None:
    """A constraint or syntax error of the step's SQL is not an outage: poison rules apply."""
    exc = StepSQLError("SQL of the step failed: duplicate key value")
    assert not is_outage(exc)
    verdict, _, _ = decision(exc, transient=(MailAPIError,))
    assert verdict is Verdict.DEAD  # outside the declared list: fatal, as before


@pytest.mark.parametrize("exc", [ConnectionError("reset"), TimeoutError("slow")])
def test_transient_adds_to_the_built_in_outage_errors(exc: BaseException) -> None:
    """``transient=(ValueError,)`` keeps ConnectionError and TimeoutError retried."""
    policy = RetryPolicy(transient=(ValueError,))
    assert not is_fatal(exc, policy)
    assert is_declared(exc, policy)
    assert is_declared(ValueError(), policy)
    assert is_fatal(KeyError("x"), policy)


def test_an_explicit_fatal_class_still_wins_over_a_built_in_outage_error() -> None:
    """``fatal=(ConnectionRefusedError,)`` is what the task asked for: it is kept."""
    policy = RetryPolicy(fatal=(ConnectionRefusedError,))
    assert is_fatal(ConnectionRefusedError(), policy)


def test_a_repeated_error_is_not_poison_while_other_jobs_of_the_task_fail_the_same_way() -> None:
    """Many jobs hitting one error at once is an outage: nothing is buried as poison."""
    exc = MailAPIError("503 Service Unavailable")
    history = FailureHistory(streak_span_s=60.0, peers_failing=4)
    verdict, _, reason = decision(
        exc, attempt=3, same=3, max_attempts=10, poison_threshold=3, history=history
    )
    assert verdict is Verdict.RETRY
    assert "4 other jobs" in reason


def test_a_repeated_error_close_together_waits_out_the_backoff_before_it_is_poison() -> None:
    """Failures that came fast (jitter near zero) are retried once more, after the backoff
    they skipped, so an error that clears up when retried later is not buried."""
    exc = MailAPIError("503")
    policy = {"max_attempts": 10, "poison_threshold": 3, "backoff_base_s": 1.0}
    needed = poison_span_s(RetryPolicy(**policy))
    assert needed == 7.0  # 1 + 2 + 4 s: the backoff ceilings of the streak's retries
    quick = FailureHistory(streak_span_s=0.5, peers_failing=0)
    verdict, delay_s, _ = decision(exc, attempt=3, same=3, history=quick, **policy)
    assert verdict is Verdict.RETRY
    assert delay_s >= needed - 0.5
    spread = FailureHistory(streak_span_s=needed, peers_failing=0)
    verdict, _, reason = decision(exc, attempt=4, same=4, history=spread, **policy)
    assert verdict is Verdict.DEAD
    assert reason == "poison: the same MailAPIError 4 times in a row"


def test_poison_needs_history_only_once_the_count_is_reached() -> None:
    """The attempt log is read only when a job may be poison (rarely)."""
    policy = RetryPolicy(max_attempts=10, poison_threshold=3)
    exc = MailAPIError("503")
    assert not needs_history(exc, attempt=2, policy=policy, same=2)
    assert needs_history(exc, attempt=3, policy=policy, same=3)
    assert not needs_history(exc, attempt=10, policy=policy, same=10)  # exhausted anyway
