"""The process worker (``jobguard worker --processes N``) under real signals (#17).

Each slot is a child process of the supervisor. A slot SIGKILLed from outside is replaced and
its job recovered with its ``db_step`` effect written once; SIGTERM stops the slots gracefully
(a running job finishes within ``--grace-s``, or is released uncharged after it). Real
processes on both backends; the tests wait on the handlers' own events, never on time.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobguard import App, JobStatus, Outcome
from jobguard.models import DeadCode
from tests.support import procs_app
from tests.support.procs import SCHEDULING_SLACK_S, clean_env, entry_point, wait_until

pytestmark = pytest.mark.chaos

REPO_ROOT = Path(__file__).resolve().parents[2]
APP = "tests.support.procs_app:app"
HEARTBEAT_S = procs_app.LEASE_S / 3  # how often a slot renews its lease and lock


class Supervisor:
    """``jobguard worker --processes N`` in a process of its own."""

    def __init__(self, url: str, *args: str) -> None:
        env = clean_env()
        env[procs_app.URL_ENV] = url
        env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
        self.popen = subprocess.Popen(
            [*entry_point(), "--app", APP, "worker", *args],
            cwd=REPO_ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )

    def slots(self) -> set[int]:
        """The process ids of its live slots (its children)."""
        path = Path(f"/proc/{self.popen.pid}/task/{self.popen.pid}/children")
        return {int(pid) for pid in path.read_text().split()} if path.exists() else set()

    def stop(self, timeout_s: float = 30.0) -> tuple[int, str]:
        """SIGTERM, wait; its exit code and what it printed."""
        self.popen.send_signal(signal.SIGTERM)
        return self.wait(timeout_s)

    def wait(self, timeout_s: float = 30.0) -> tuple[int, str]:
        """Wait for it to exit; its exit code and what it printed."""
        _, err = self.popen.communicate(timeout=timeout_s)
        return self.popen.returncode, err

    def kill(self) -> None:
        """Make sure it and its slots are gone (whatever the test did)."""
        if self.popen.poll() is None:
            for pid in self.slots():
                os.kill(pid, signal.SIGKILL)
            self.popen.kill()
        self.popen.communicate(timeout=10)


@pytest.fixture
def papp(store_url: str) -> Iterator[App]:
    """The producer side of ``procs_app`` (schema and charges table made before any worker)."""
    application = procs_app.make_app(store_url)
    _ = application.backend
    procs_app.create_charges(store_url)
    yield application
    application.close()


def _ended(app: App, job_ids: list[int]) -> bool:
    return all(app.get_job(job_id).status is JobStatus.COMPLETED for job_id in job_ids)


def test_a_slot_killed_from_outside_is_replaced_and_its_job_charged_once(
    store_url: str, papp: App
) -> None:
    task = papp.tasks[procs_app.CHARGE]
    first = task.enqueue(order=1, hold=True)
    worker = Supervisor(store_url, "--processes", "2", "--grace-s", "5")
    try:
        wait_until(lambda: len(procs_app.events(store_url, "charged")) == 1)
        (charged,) = procs_app.events(store_url, "charged")
        victim = charged["pid"]
        assert victim in worker.slots()
        os.kill(victim, signal.SIGKILL)
        # Jobs of the same account, waiting on the lock the killed run held.
        others = [task.enqueue(order=n) for n in (2, 3)]
        procs_app.let_go(store_url, 1)
        wait_until(lambda: _ended(papp, [first.id] + [job.id for job in others]), 60)
        # The supervisor replaced the dead slot: two slots again, the victim not among them.
        wait_until(lambda: len(worker.slots()) == 2)
        assert victim not in worker.slots()
        code, err = worker.stop()
    finally:
        worker.kill()
    assert code == 0, err
    assert "died (exit -9) running job" in err
    assert procs_app.charges(store_url) == {1: 1, 2: 1, 3: 1}
    outcomes = [a.outcome for a in papp.attempts(job_id=first.id)]
    assert outcomes[0] is Outcome.LOST
    assert outcomes[-1] is Outcome.COMPLETED
    # Another slot ran it again, and its db_step found the charge the killed run committed.
    runs = [e for e in procs_app.events(store_url, "start") if e["order"] == 1]
    assert runs[-1]["pid"] != victim


def test_sigterm_lets_the_running_job_of_each_slot_finish(store_url: str, papp: App) -> None:
    task = papp.tasks[procs_app.CHARGE]
    job = task.enqueue(order=1, hold=True)
    worker = Supervisor(store_url, "--processes", "2", "--grace-s", "30")
    try:
        wait_until(lambda: len(procs_app.events(store_url, "charged")) == 1)
        worker.popen.send_signal(signal.SIGTERM)
        procs_app.let_go(store_url, 1)
        code, err = worker.wait()
    finally:
        worker.kill()
    assert code == 0, err
    assert papp.get_job(job.id).status is JobStatus.COMPLETED
    assert "worker stopped: completed=1; released 0" in err


def test_a_job_still_running_after_the_grace_is_released_uncharged(
    store_url: str, papp: App
) -> None:
    job = papp.tasks[procs_app.CHARGE].enqueue(order=1, hold=True)
    worker = Supervisor(store_url, "--processes", "1", "--grace-s", "0.2")
    try:
        wait_until(lambda: len(procs_app.events(store_url, "charged")) == 1)
        code, err = worker.stop()
    finally:
        worker.kill()
    assert code == 0, err
    assert "released 1" in err
    stored = papp.get_job(job.id)
    assert stored.status is JobStatus.QUEUED
    assert stored.attempts == 0
    assert [a.outcome for a in papp.attempts(job_id=job.id)] == [Outcome.RELEASED]


def _charged(url: str, order: int) -> list[dict[str, object]]:
    return [e for e in procs_app.events(url, "charged") if e["order"] == order]


def test_a_run_blocked_forever_is_killed_at_its_hard_limit_and_its_lock_freed(
    store_url: str, papp: App
) -> None:
    task = papp.tasks[procs_app.CHARGE]
    # Blocks on a socket on its first delivery; a hard limit of its own, stored with the job.
    stuck = task.options(time_limit_s=2.0).enqueue(order=1, hang_attempts=1)
    worker = Supervisor(store_url, "--processes", "2")
    try:
        wait_until(lambda: len(_charged(store_url, 1)) == 1)
        (killed,) = _charged(store_url, 1)
        # The next job on the same account: it waits for the lock the stuck run holds.
        follower = task.enqueue(order=2)
        wait_until(lambda: _ended(papp, [stuck.id, follower.id]), 60)
        assert killed["pid"] not in worker.slots()
        wait_until(lambda: len(worker.slots()) == 2)  # the killed slot was replaced
        code, err = worker.stop()
    finally:
        worker.kill()
    assert code == 0, err
    assert "past its hard time limit" in err
    timed_out = papp.attempts(job_id=stuck.id)[0]
    assert timed_out.outcome is Outcome.TIMED_OUT
    assert timed_out.error_type == "HardTimeLimitExceeded"
    assert timed_out.fence == killed["fence"]
    assert timed_out.duration_s is not None
    assert timed_out.duration_s >= 2.0  # killed at its limit, not before
    # ... and its ending (which frees its lock) written within the limit plus one heartbeat
    # (plus room for scheduling on a loaded machine; still well under the lock's expiry).
    assert timed_out.duration_s <= 2.0 + HEARTBEAT_S + SCHEDULING_SLACK_S
    assert papp.attempts(job_id=stuck.id)[-1].outcome is Outcome.COMPLETED
    # Each order charged once: the retry found the charge the killed run had committed.
    assert procs_app.charges(store_url) == {1: 1, 2: 1}
    # Every run on the account after the kill held the lock with a larger fence.
    later = [e for e in procs_app.events(store_url, "start") if e["t"] > killed["t"]]
    assert later
    assert all(e["fence"] > killed["fence"] for e in later)


def test_a_job_that_times_out_on_every_delivery_is_buried_with_its_attempts_exhausted(
    store_url: str, papp: App
) -> None:
    job = papp.tasks[procs_app.CHARGE].enqueue(order=1, hang_attempts=procs_app.MAX_ATTEMPTS)
    worker = Supervisor(store_url, "--processes", "1", "--time-limit-s", "0.5")
    try:
        wait_until(lambda: papp.get_job(job.id).status is JobStatus.DEAD, 60)
        code, err = worker.stop()
    finally:
        worker.kill()
    assert code == 0, err
    attempts = papp.attempts(job_id=job.id)
    assert [a.outcome for a in attempts] == [Outcome.TIMED_OUT] * procs_app.MAX_ATTEMPTS
    assert {a.error_type for a in attempts} == {"HardTimeLimitExceeded"}
    dead = papp.get_job(job.id)
    assert dead.dead_code is DeadCode.EXHAUSTED
    assert dead.attempts == procs_app.MAX_ATTEMPTS
    assert dead.dead_reason is not None
    assert "attempts exhausted" in dead.dead_reason
    assert procs_app.charges(store_url) == {1: 1}


def test_a_run_that_ignores_its_soft_limit_is_killed_after_the_soft_limits_chance(
    store_url: str, papp: App
) -> None:
    # A soft limit of 0.5 s and a hard one of 30 s: told at its soft limit, the run blocked on
    # a socket cannot listen; one heartbeat later the slot asks for it to be killed.
    job = papp.tasks[procs_app.LIMITED].enqueue(order=1, hang_attempts=1)
    worker = Supervisor(store_url, "--processes", "1")
    try:
        wait_until(lambda: len(_charged(store_url, 1)) == 1)
        (killed,) = _charged(store_url, 1)
        wait_until(lambda: papp.get_job(job.id).status is JobStatus.COMPLETED, 60)
        assert killed["pid"] not in worker.slots()
        code, err = worker.stop()
    finally:
        worker.kill()
    assert code == 0, err
    first = papp.attempts(job_id=job.id)[0]
    assert first.outcome is Outcome.TIMED_OUT
    assert first.error_type == "TimeLimitExceeded"
    assert first.duration_s is not None
    assert procs_app.SOFT_LIMIT_S <= first.duration_s < procs_app.HARD_LIMIT_S
    assert procs_app.charges(store_url) == {1: 1}


def test_a_cancelled_run_that_does_not_stop_is_killed_and_not_retried(
    store_url: str, papp: App
) -> None:
    job = papp.tasks[procs_app.CHARGE].enqueue(order=1, hang_attempts=procs_app.MAX_ATTEMPTS)
    worker = Supervisor(store_url, "--processes", "1")
    try:
        wait_until(lambda: len(_charged(store_url, 1)) == 1)
        (killed,) = _charged(store_url, 1)
        papp.cancel(job.id, actor="ops")
        wait_until(lambda: papp.get_job(job.id).status is JobStatus.DEAD, 30)
        wait_until(lambda: len(worker.slots()) == 1)  # replaced
        assert killed["pid"] not in worker.slots()
        follower = papp.tasks[procs_app.CHARGE].enqueue(order=2)
        wait_until(lambda: _ended(papp, [follower.id]), 30)  # the account's lock was freed
        code, err = worker.stop()
    finally:
        worker.kill()
    assert code == 0, err
    dead = papp.get_job(job.id)
    assert dead.dead_code is DeadCode.CANCELLED
    assert [a.outcome for a in papp.attempts(job_id=job.id)] == [Outcome.DEAD]
    assert [e["pid"] for e in procs_app.events(store_url, "start") if e["order"] == 1] == [
        killed["pid"]
    ]
    assert procs_app.charges(store_url) == {1: 1, 2: 1}


def test_a_stopping_worker_still_kills_a_run_at_its_hard_limit(store_url: str, papp: App) -> None:
    task = papp.tasks[procs_app.CHARGE]
    job = task.options(time_limit_s=2.0).enqueue(order=1, hang_attempts=1)
    # A grace far longer than the limit: the limit, not the grace, ends the run.
    worker = Supervisor(store_url, "--processes", "1", "--grace-s", "600")
    try:
        wait_until(lambda: len(_charged(store_url, 1)) == 1)
        code, err = worker.stop(timeout_s=60)
    finally:
        worker.kill()
    assert code == 0, err
    (attempt,) = papp.attempts(job_id=job.id)
    assert attempt.outcome is Outcome.TIMED_OUT
    assert attempt.error_type == "HardTimeLimitExceeded"
    assert papp.get_job(job.id).status is JobStatus.QUEUED  # retried, by a worker to come
