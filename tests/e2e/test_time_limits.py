"""Time-limit options, soft limits in a thread-mode worker, and ``jobguard cancel`` (#17).

On both stores, in-process workers (burst mode); the tests with worker processes, a hanging
handler and cancels of running jobs are in ``tests/chaos``. Bad input (acceptance 5) is refused
where it enters, with a message naming the option, and changes nothing.
"""

from __future__ import annotations

import asyncio
import math
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from jobguard import App, Context, TimeLimitExceeded
from jobguard.exceptions import ConfigurationError
from jobguard.models import DeadCode, JobStatus, Outcome
from tests.support.procs import clean_env, run_cli

LIMIT_S = 0.3


def run_burst(app: App) -> None:
    app.worker(install_signal_handlers=False, poll_interval_s=0.02).run(burst=True)


def work_until_stopped(ctx: Context) -> int:
    """Steps until the soft limit stops it (the next step raises)."""
    for i in range(10_000):
        ctx.step(f"tick-{i}", lambda: None)
        time.sleep(0.01)
    return -1


BAD_LIMITS: list[Any] = [0, -1, math.nan, math.inf, "5", True, 11 * 365 * 24 * 3600.0]


@pytest.mark.parametrize("value", BAD_LIMITS)
@pytest.mark.parametrize("option", ["soft_time_limit_s", "time_limit_s"])
def test_a_limit_that_is_not_a_positive_finite_number_is_refused_naming_it(
    db_path: Path, option: str, value: Any
) -> None:
    """Checked above the store, before it is touched: one store suffices."""
    app = App(f"sqlite:///{db_path}")
    try:
        with pytest.raises(ConfigurationError, match=f"task 'bad': {option} must be"):
            app.task(name="bad", **{option: value})(lambda ctx: None)
        assert "bad" not in app.tasks

        @app.task(name="ok")
        def ok(ctx: Context) -> None:
            pass

        with pytest.raises(ConfigurationError, match=f"{option} must be"):
            ok.options(**{option: value}).enqueue()
        with pytest.raises(ConfigurationError, match=f"{option} must be"):
            app.enqueue("ok", {}, **{option: value})
        assert sum(app.counts().values()) == 0  # nothing stored
    finally:
        app.close()


def test_a_soft_limit_not_below_the_hard_one_is_refused(store_url: str) -> None:
    app = App(store_url)
    try:
        with pytest.raises(ConfigurationError, match=r"soft_time_limit_s \(5\) must be less"):
            app.task(name="t", soft_time_limit_s=5, time_limit_s=5)(lambda ctx: None)

        @app.task(name="hard", time_limit_s=10)
        def hard(ctx: Context) -> None:
            pass

        with pytest.raises(ConfigurationError, match=r"soft_time_limit_s \(20\) must be less"):
            hard.options(soft_time_limit_s=20).enqueue()
        assert sum(app.counts().values()) == 0
    finally:
        app.close()


def test_limits_are_stored_with_the_job_a_call_overriding_the_task(store_url: str) -> None:
    app = App(store_url)
    try:

        @app.task(name="limited", soft_time_limit_s=30, time_limit_s=60)
        def limited(ctx: Context) -> None:
            pass

        default = app.get_job(limited.enqueue().id)
        assert (default.soft_time_limit_s, default.time_limit_s) == (30, 60)
        call = app.get_job(limited.options(soft_time_limit_s=5).enqueue().id)
        assert (call.soft_time_limit_s, call.time_limit_s) == (5, 60)
        plain = app.task(name="plain")(lambda ctx: None)
        none = app.get_job(plain.enqueue().id)
        assert (none.soft_time_limit_s, none.time_limit_s) == (None, None)
    finally:
        app.close()


def test_a_thread_worker_refuses_to_start_with_a_task_that_has_a_hard_limit(
    store_url: str,
) -> None:
    app = App(store_url)
    try:

        @app.task(name="exporter", time_limit_s=60)
        def exporter(ctx: Context) -> None:
            pass

        job = exporter.enqueue()
        with pytest.raises(ConfigurationError, match=r"task 'exporter' \(time_limit_s=60\)"):
            app.worker(install_signal_handlers=False)
        got = app.get_job(job.id)
        assert (got.status, got.attempts) == (JobStatus.QUEUED, 0)  # changed nothing
    finally:
        app.close()


def test_a_thread_worker_leaves_a_job_with_a_hard_limit_for_another_worker(
    store_url: str,
) -> None:
    """A hard limit given per call: the worker cannot refuse it at start, so it hands the job
    back uncharged, saying why, and never runs it."""
    app = App(store_url)
    ran: list[int] = []
    try:

        @app.task(name="t")
        def t(ctx: Context) -> None:
            ran.append(ctx.job_id)

        job = t.options(time_limit_s=60).enqueue()
        run_burst(app)
        got = app.get_job(job.id)
        assert ran == []
        assert (got.status, got.attempts) == (JobStatus.QUEUED, 0)
        attempts = app.attempts(job_id=job.id)
        assert got.deferrals == len(attempts) >= 1  # burst may meet it again after its delay
        for attempt in attempts:
            assert attempt.outcome == Outcome.DEFERRED
            assert "only a process-mode worker" in (attempt.error_message or "")
    finally:
        app.close()


def test_a_cooperative_handler_is_stopped_at_its_soft_limit_and_retried(store_url: str) -> None:
    app = App(store_url)
    try:

        @app.task(
            name="slow",
            operation_key="slow:{n}",
            soft_time_limit_s=LIMIT_S,
            backoff_base_s=0.0,
            max_attempts=3,
        )
        def slow(ctx: Context, n: int) -> str:
            ctx.step("prepare", lambda: n)
            if ctx.attempt == 1:
                work_until_stopped(ctx)
            assert not ctx.time_limit_passed
            return "done"

        job = slow.enqueue(n=1)
        run_burst(app)
        assert app.get_job(job.id).status == JobStatus.COMPLETED
        first, second = app.attempts(job_id=job.id)
        assert (first.outcome, first.error_type) == (Outcome.TIMED_OUT, "TimeLimitExceeded")
        assert first.duration_s is not None
        assert first.duration_s >= LIMIT_S
        assert (second.outcome, second.steps_skipped) == (Outcome.COMPLETED, 1)
    finally:
        app.close()


def test_an_async_handler_is_cancelled_at_its_soft_limit(store_url: str) -> None:
    """Cancelled on the worker's loop; with its attempts spent the job is buried, and the
    attempt still says it timed out."""
    app = App(store_url)
    seen: list[str] = []
    try:

        @app.task(name="waits", soft_time_limit_s=LIMIT_S, max_attempts=1)
        async def waits(ctx: Context) -> None:
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                seen.append(f"cancelled, passed={ctx.time_limit_passed}")
                raise

        job = waits.enqueue()
        run_burst(app)
        got = app.get_job(job.id)
        assert (got.status, got.dead_code) == (JobStatus.DEAD, DeadCode.EXHAUSTED)
        (attempt,) = app.attempts(job_id=job.id)
        assert (attempt.outcome, attempt.error_type) == (Outcome.TIMED_OUT, "TimeLimitExceeded")
        assert seen == ["cancelled, passed=True"]
    finally:
        app.close()


def test_a_job_that_keeps_timing_out_is_buried_as_poison(store_url: str) -> None:
    """Every timeout of a job has one signature: repeated, it stands out as the job's own."""
    app = App(store_url)
    try:

        @app.task(
            name="stuck",
            soft_time_limit_s=0.1,
            backoff_base_s=0.0,
            max_attempts=10,
            poison_threshold=2,
        )
        def stuck(ctx: Context) -> None:
            while not ctx.time_limit_passed:
                time.sleep(0.01)
            raise TimeLimitExceeded("gave up")  # raised by the handler itself: the same stop

        job = stuck.enqueue()
        run_burst(app)
        got = app.get_job(job.id)
        assert (got.status, got.dead_code) == (JobStatus.DEAD, DeadCode.POISON)
        outcomes = [a.outcome for a in app.attempts(job_id=job.id)]
        assert outcomes == [Outcome.TIMED_OUT, Outcome.TIMED_OUT]
    finally:
        app.close()


def cancel_cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli("--url", url, "cancel", *args)


def test_jobguard_cancel_through_the_real_executable(store_url: str) -> None:
    app = App(store_url)
    try:
        task = app.task(name="later")(lambda ctx: None)
        job = task.options(delay_s=3600).enqueue()
        done = cancel_cli(store_url, str(job.id))
        assert done.returncode == 0, done.stderr
        assert f"job {job.id} cancelled: it will not run" in done.stdout
        got = app.get_job(job.id)
        assert (got.status, got.dead_code) == (JobStatus.DEAD, DeadCode.CANCELLED)
        (entry,) = app.audit_trail()
        assert entry.actor.startswith("cli")
        assert got.dead_reason == f"job {job.id} was cancelled by {entry.actor}"
        again = cancel_cli(store_url, str(job.id))
        assert again.returncode == 1
        assert again.stderr.strip() == (
            f"error: job {job.id} is dead: only a queued, scheduled or running job can be cancelled"
        )
        unknown = cancel_cli(store_url, "999")
        assert unknown.returncode == 1
        assert unknown.stderr.startswith("error: ")
        assert len(unknown.stderr.strip().splitlines()) == 1
        for bad in ("0", "x", "-3"):
            usage = cancel_cli(store_url, bad)
            assert usage.returncode == 2, usage.stderr
            assert len(usage.stderr.strip().splitlines()) == 1
        assert len(app.audit_trail()) == 1  # the refused ones changed nothing
    finally:
        app.close()


HARD_APP = """
from jobguard import App

app = App({url!r})


@app.task(name="export", time_limit_s=30)
def export(ctx):
    pass
"""


def test_jobguard_worker_with_a_hard_limit_in_thread_mode_exits_2(
    store_url: str, tmp_path: Path
) -> None:
    (tmp_path / "hard_limit_app.py").write_text(HARD_APP.format(url=store_url))
    env = clean_env()
    env["PYTHONPATH"] = str(tmp_path)
    result = run_cli("--app", "hard_limit_app:app", "worker", "--burst", env=env, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: task 'export' (time_limit_s=30) has a hard time limit")
