"""Promises kept under day-one and hostile use, with real worker processes.

Retries do what the task says, steps are exact, one job's bad data never hurts another job,
and a heartbeat that cannot do its job stops its worker loudly. Every test runs real worker
interpreters on each backend's store (``store_url``); side effects are counted outside jobguard
(see ``tests.support.hostile_app``).
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobguard import App, JobStatus, Outcome
from tests.support import hostile_app as hostile
from tests.support import stores
from tests.support.ports import fetch
from tests.support.procs import (
    REPO_ROOT,
    WorkerProcess,
    clean_env,
    entry_point,
    spawn_worker,
    wait_until,
    workers,
)


@pytest.fixture
def effects_path(tmp_path: Path) -> Path:
    """The sidecar file where the hostile tasks count their side effects."""
    return tmp_path / "effects.db"


@pytest.fixture
def happ(store_url: str) -> Iterator[App]:
    """The hostile app on this test's store (the producer's and the inspector's side)."""
    application = hostile.make_app(store_url)
    yield application
    application.close()


def drain_with_worker(store_url: str, effects_path: Path) -> None:
    """Run one real worker process in burst mode until the queue is drained; it must exit 0."""
    proc = spawn_worker(
        store_url,
        "tests.support.hostile_app",
        burst=True,
        env={hostile.EFFECTS_ENV: str(effects_path)},
    )
    with workers(proc):
        proc.wait_ready()
        assert proc.wait(timeout_s=60) == 0
        proc.output()


def dead_after_one_delivery(app: App, job_id: int, store_url: str, effects_path: Path) -> str:
    """Drain with a real worker; the job must be dead after one delivery. Return its reason."""
    drain_with_worker(store_url, effects_path)
    final = app.get_job(job_id)
    assert (final.status, final.attempts) == (JobStatus.DEAD, 1)
    assert final.dead_reason is not None
    return final.dead_reason


# -- retries do what the task says --------------------------------------------------------------


@pytest.mark.parametrize("task", [hostile.OUTAGE, hostile.OUTAGE_DECLARED])
def test_an_outage_shorter_than_max_attempts_is_retried_through_not_buried_as_poison(
    happ: App, store_url: str, effects_path: Path, task: str
) -> None:
    """``ConnectionError`` on four deliveries, success on the fifth, ``max_attempts=5``: the job
    completes on attempt 5, with or without ``transient=(ConnectionError,)`` (G7)."""
    job = happ.enqueue(task, {"failures": 4})
    drain_with_worker(store_url, effects_path)
    final = happ.get_job(job.id)
    assert (final.status, final.attempts, final.dead_reason) == (JobStatus.COMPLETED, 5, None)
    assert hostile.effects(effects_path, job.id) == [f"attempt-{n}" for n in range(1, 6)]


def test_a_configuration_error_in_the_task_is_fatal_at_once(
    happ: App, store_url: str, effects_path: Path
) -> None:
    """``ctx.step`` in a task without an operation key buries the job on its first delivery,
    saying how to fix it, instead of retrying a mistake every rerun repeats (G7)."""
    job = happ.enqueue(hostile.STEP_WITHOUT_KEY, {})
    reason = dead_after_one_delivery(happ, job.id, store_url, effects_path)
    assert "ConfigurationError" in reason
    assert "operation_key" in reason
    assert hostile.effects(effects_path, job.id) == []


# -- steps are exact ----------------------------------------------------------------------------


def test_a_step_name_reused_in_one_execution_is_refused_and_says_how_to_name_steps(
    happ: App, store_url: str, effects_path: Path
) -> None:
    """``ctx.step("send", ...)`` in a loop: the second call is a StepError (not the first
    call's result handed back), the job is buried at once, and the one send that ran is not
    repeated (G5)."""
    job = happ.enqueue(hostile.STEP_LOOP, {"batch": 1, "recipients": ["ann", "bob", "cy"]})
    reason = dead_after_one_delivery(happ, job.id, store_url, effects_path)
    assert "StepError" in reason
    assert "'send' was already used in this execution" in reason
    assert 'ctx.step(f"send-{recipient_id}"' in reason
    assert hostile.effects(effects_path, job.id) == ["send-ann"]


def test_a_step_result_json_would_change_is_refused_before_it_is_recorded_and_not_rerun(
    happ: App, store_url: str, effects_path: Path
) -> None:
    """A step returning a tuple (JSON would give back a list) fails on the first run, is not
    recorded as done, and its side effect is not run again and again: the job is buried at
    once, since every rerun would repeat it (G5)."""
    job = happ.enqueue(hostile.TUPLE_STEP, {"n": 3})
    reason = dead_after_one_delivery(happ, job.id, store_url, effects_path)
    assert "result is a tuple, which JSON gives back as a list" in reason
    operation = happ.operation("quote:3")
    assert operation is not None
    assert operation.steps == {}
    assert hostile.effects(effects_path, job.id) == ["quote"]


# -- one job's bad data never hurts another job -------------------------------------------------


def test_an_error_message_no_store_accepts_is_recorded_made_storable(
    happ: App, store_url: str, effects_path: Path
) -> None:
    """A lone surrogate and a NUL in an exception message: every failure is still recorded
    (with U+FFFD in their place) and the job ends for the true reason (G12)."""
    job = happ.enqueue(hostile.BAD_TEXT, {})
    drain_with_worker(store_url, effects_path)
    final = happ.get_job(job.id)
    assert (final.status, final.attempts) == (JobStatus.DEAD, 2)
    assert final.dead_reason == "attempts exhausted (2/2): ValueError"
    attempts = happ.attempts(job_id=job.id)
    assert [a.outcome for a in attempts] == [Outcome.RETRY, Outcome.DEAD]
    stored = "upstream said \ufffd\ufffd and hung up"
    assert [a.error_message for a in attempts] == [stored, stored]
    assert all(a.traceback and stored in a.traceback for a in attempts)


def test_an_external_reference_no_store_accepts_is_stored_made_storable(
    happ: App, store_url: str, effects_path: Path
) -> None:
    """``ctx.set_external_ref`` with a lone surrogate: the job completes once, the reference is
    stored with U+FFFD, and the healthy jobs acked with it are not run again (G12)."""
    healthy = [happ.enqueue(hostile.NOOP, {"n": n}) for n in range(4)]
    job = happ.enqueue(hostile.BAD_REF, {"n": 1})
    drain_with_worker(store_url, effects_path)
    assert happ.get_job(job.id).status == JobStatus.COMPLETED
    operation = happ.operation("ref:1")
    assert operation is not None
    assert operation.external_ref == "ref-\ufffd-1"
    for other in [*healthy, job]:
        assert happ.get_job(other.id).attempts == 1
    assert hostile.effects(effects_path, job.id) == ["ref"]


DEEP = 100_000


def bury_a_planted_payload(
    happ: App, store_url: str, effects_path: Path, planted: object, expected: str
) -> None:
    """Plant ``planted`` as a queued job's payload; it is buried after one delivery with
    ``expected`` as its reason, and the job next to it runs."""
    job = happ.enqueue(hostile.NOOP, {"n": 1})
    neighbour = happ.enqueue(hostile.NOOP, {"n": 2})
    jobs = stores.table(store_url, "jobs")
    stores.execute(store_url, [f"UPDATE {jobs} SET payload = ? WHERE id = ?"], [(planted, job.id)])
    reason = dead_after_one_delivery(happ, job.id, store_url, effects_path)
    assert reason.startswith(expected)
    assert happ.get_job(neighbour.id).status == JobStatus.COMPLETED
    assert hostile.effects(effects_path, job.id) == []


def test_a_planted_payload_nested_too_deep_goes_to_the_dead_letter_queue_with_the_true_reason(
    happ: App, store_url: str, effects_path: Path
) -> None:
    """A payload written behind jobguard's back (no enqueue would accept it) is buried after
    one delivery with what is wrong with it; no RecursionError escapes (G12)."""
    planted = '{"data": ' + "[" * DEEP + "]" * DEEP + "}"
    bury_a_planted_payload(
        happ, store_url, effects_path, planted, "payload nests too deeply to decode"
    )


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)  # only SQLite stores a BLOB
def test_a_payload_planted_as_a_blob_goes_to_the_dead_letter_queue_with_the_true_reason(
    happ: App, store_url: str, effects_path: Path
) -> None:
    """A BLOB of invalid UTF-8 where the payload text belongs: buried, no TypeError (G12)."""
    bury_a_planted_payload(happ, store_url, effects_path, b"\xff\xfe{", "payload is not valid JSON")


# -- async handlers under a crash -----------------------------------------------------------------


def test_an_async_step_survives_a_killed_worker_and_is_not_run_again(
    happ: App, store_url: str, effects_path: Path
) -> None:
    """A real worker runs an ``async def`` handler on its loop; it is SIGKILLed right after
    ``await ctx.step_async`` recorded the charge. The next worker takes the job when the lease
    expires, skips the charge and finishes (G11, G5.1)."""
    job = happ.enqueue(hostile.ASYNC_CHARGE, {"order_id": 4})
    env = {hostile.EFFECTS_ENV: str(effects_path)}
    first = spawn_worker(store_url, "tests.support.hostile_app", env=env)
    with workers(first):
        first.wait_ready()
        assert first.wait(timeout_s=30) == -signal.SIGKILL
        first.output()
    second = spawn_worker(store_url, "tests.support.hostile_app", env=env)
    with workers(second):
        second.wait_ready()
        wait_until(lambda: happ.get_job(job.id).status == JobStatus.COMPLETED, timeout_s=30)
        second.signal(signal.SIGTERM)
        assert second.wait(timeout_s=30) == 0
        second.output()
    assert happ.get_job(job.id).attempts == 2
    assert hostile.effects(effects_path, job.id) == ["charge"]
    operation = happ.operation("charge:4")
    assert operation is not None
    assert operation.result == {"charge": "ch_4"}
    assert [a.steps_skipped for a in happ.attempts(job_id=job.id)][-1] == 1


# -- the heartbeat never dies silently ----------------------------------------------------------


def test_a_heartbeat_that_fails_stops_its_worker_which_says_why_and_exits_non_zero(
    happ: App, store_url: str, effects_path: Path
) -> None:
    """The heartbeat meets an error it does not expect (here a bug injected where it reads a
    lost lease): the worker stops taking work, logs why, and ``jobguard worker`` exits 1 with
    a one-line error, instead of running on without renewing leases (G2.5)."""
    job = happ.enqueue(hostile.HOLD_UNTIL_LOST, {})
    env = clean_env()
    env.update(
        {
            "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")]),
            hostile.URL_ENV: store_url,
            hostile.EFFECTS_ENV: str(effects_path),
        }
    )
    command = [
        *entry_point(),
        "--app",
        "tests.support.hostile_app:app",
        "worker",
        "--concurrency",
        "1",
        "--prefetch",
        "0",
        "--grace-s",
        "1",
    ]
    popen = subprocess.Popen(
        command, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    proc = WorkerProcess(popen)
    with workers(proc):
        wait_until(lambda: hostile.effects(effects_path, job.id) == ["start"], timeout_s=30)
        # Pause the worker past its 1 s lease and let another consumer take the job over.
        proc.pause_between_writes(store_url)
        wait_until(lambda: bool(fetch(happ.backend, ["default"], 1, "thief")), timeout_s=10)
        proc.signal(signal.SIGCONT)
        try:
            code = proc.wait(timeout_s=30)
        except subprocess.TimeoutExpired:
            pytest.fail("the worker kept running after its heartbeat failed")
        output = proc.output()
    assert code == 1, output
    last = output.strip().splitlines()[-1]
    assert last.startswith("error: worker ")
    assert "stopped taking work: its heartbeat failed with RuntimeError" in last
    assert hostile.LEASE_BUG in last
