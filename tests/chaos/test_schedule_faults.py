"""Several real ``jobguard scheduler`` processes on one store: every tick is one job, once (#10).

The schedulers are the installed command line, run against ``tests.support.schedule_app``; a real
worker runs the jobs and its handler records every execution in a sidecar file. Every test runs
on SQLite and on PostgreSQL.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from jobguard import App, JobStatus
from jobguard.core.schedules import parse_tick_text
from tests.support.procs import REPO_ROOT, WorkerProcess, clean_env, entry_point, wait_until
from tests.support.schedule_app import GAP_POLICIES, executions, set_clock

pytestmark = pytest.mark.chaos

APP = "tests.support.schedule_app:app"
WINDOW_TICKS = 60  # 1-second ticks of the store clock the fault test covers


class Fleet:
    """The processes of one test, with their environment; all are killed at the end."""

    def __init__(
        self, tmp_path: Path, stack: ExitStack, url: str, clock: Path | None = None
    ) -> None:
        self.tmp_path = tmp_path
        self.url = url
        self.events = tmp_path / "runs.db"
        self.env = clean_env()
        self.env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + self.env.get("PYTHONPATH", "")
        self.env["SCHEDULE_TEST_URL"] = url
        self.env["SCHEDULE_TEST_EVENTS"] = str(self.events)
        if clock is not None:
            self.env["SCHEDULE_TEST_CLOCK"] = str(clock)
        # A process that does not stop is sent SIGABRT: its threads' tracebacks go to its log.
        self.env["PYTHONFAULTHANDLER"] = "1"
        self.stack = stack
        self.started = 0
        self.logs: dict[int, Path] = {}

    def start(self, *args: str) -> WorkerProcess:
        """Run ``jobguard --app APP ARGS...`` and wait until it says it is running."""
        self.started += 1
        log = self.tmp_path / f"proc{self.started}.log"
        with log.open("w") as out:
            popen = subprocess.Popen(
                [*entry_point(), "--app", APP, *args],
                cwd=self.tmp_path,
                env=self.env,
                stdout=subprocess.DEVNULL,
                stderr=out,
                text=True,
            )
        proc = WorkerProcess(popen)
        self.logs[proc.pid] = log
        self.stack.callback(proc.kill)

        def ready() -> bool:
            if popen.poll() is not None:
                raise AssertionError(f"{args} exited {popen.returncode}: {log.read_text()}")
            return log.read_text().startswith(("scheduler ", "worker "))

        wait_until(ready, timeout_s=30)
        return proc

    def scheduler(self, names: str, poll_interval_s: float = 0.05) -> WorkerProcess:
        """A ``jobguard scheduler`` for some schedules."""
        return self.start(
            "scheduler", "--schedules", names, "--poll-interval-s", str(poll_interval_s)
        )

    def stop(self, proc: WorkerProcess) -> None:
        """SIGTERM and wait for a clean exit; on a hang, fail with the process's tracebacks."""
        proc.signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout_s=30)
        except subprocess.TimeoutExpired:
            proc.signal(signal.SIGABRT)
            proc.wait(timeout_s=10)
            raise AssertionError(
                f"no exit on SIGTERM:\n{self.logs[proc.pid].read_text()}"
            ) from None
        assert code == 0, self.logs[proc.pid].read_text()


def ticks_of(store: App, name: str) -> list[int]:
    """The tick of every job of schedule ``name``, in job order."""
    jobs = [job for job in store.jobs(limit=100_000) if job.task == name]
    return [parse_tick_text(json.loads(job.payload)["tick"]) for job in reversed(jobs)]


@pytest.fixture
def stack() -> Iterator[ExitStack]:
    with ExitStack() as processes:
        yield processes


def test_three_schedulers_killed_and_paused_make_one_job_and_one_run_per_tick(
    tmp_path: Path, stack: ExitStack, store_url: str
) -> None:
    """Three schedulers on a 1-second schedule for 60 ticks: one SIGKILLed and restarted twice,
    one SIGSTOPped for 5 s; every tick has exactly one job and one execution, none missing.

    The seconds are the store clock's, shared by every process through a file: the test moves
    it one tick at a time once the tick before is enqueued and run, so the 60 ticks take no
    60 s of waiting and no fault lands a tick early or late on a slow machine. The schedulers
    still race for every tick (each polls the clock every 50 ms and all see a tick fall due
    at once), and the faults land where they did on real seconds: between ticks for the
    kills, between two transactions for the pause, with 5 ticks falling while it is frozen.
    """
    clock = tmp_path / "clock"
    t0 = 1_900_000_000
    set_clock(clock, t0 + 0.1)
    fleet = Fleet(tmp_path, stack, store_url, clock=clock)
    store = App(store_url)
    stack.callback(store.close)
    killed = fleet.scheduler("beat")
    paused = fleet.scheduler("beat")
    steady = fleet.scheduler("beat")
    worker = fleet.start("worker", "--concurrency", "2", "--grace-s", "5")
    first_tick = min(wait_for_ticks(store, 1))
    assert first_tick == t0
    now = [first_tick]

    def reached(offset: int) -> None:
        """Move the clock tick by tick to ``first_tick + offset``, each tick enqueued and run
        before the next falls due."""
        while now[0] < first_tick + offset:
            now[0] += 1
            set_clock(clock, now[0] + 0.1)

            def enqueued_and_run() -> bool:
                ticks = ticks_of(store, "beat")
                return max(ticks) >= now[0] and store.counts()[JobStatus.COMPLETED] == len(ticks)

            wait_until(enqueued_and_run, timeout_s=30)

    reached(3)
    killed.kill()  # SIGKILL, then restart
    killed = fleet.scheduler("beat")
    reached(6)
    paused.pause_between_writes(store_url)  # SIGSTOP, between two of its transactions
    reached(11)  # 5 ticks pass while it is frozen
    paused.signal(signal.SIGCONT)
    reached(WINDOW_TICKS // 2)
    killed.kill()
    killed = fleet.scheduler("beat")
    reached(WINDOW_TICKS)
    for proc in (killed, paused, steady):
        fleet.stop(proc)
    last_tick = max(ticks_of(store, "beat"))
    wait_until(lambda: store.counts()[JobStatus.COMPLETED] == len(ticks_of(store, "beat")))
    fleet.stop(worker)

    ticks = ticks_of(store, "beat")
    assert sorted(Counter(ticks).values()) == [1] * len(ticks)  # one job per tick
    assert sorted(ticks) == list(range(first_tick, last_tick + 1))  # none missing
    assert last_tick - first_tick >= WINDOW_TICKS
    ran = Counter(parse_tick_text(tick) for tick, _pid in executions(fleet.events))
    assert ran == Counter(ticks)  # exactly one execution of each tick, and of nothing else


def wait_for_ticks(store: App, count: int) -> list[int]:
    """Wait until the beat schedule has ``count`` jobs; return their ticks."""
    found: list[int] = []

    def enough() -> bool:
        found[:] = ticks_of(store, "beat")
        return len(found) >= count

    wait_until(enough, timeout_s=30)
    return found


def test_a_gap_with_every_scheduler_down_follows_each_policy_exactly(
    tmp_path: Path, stack: ExitStack, store_url: str
) -> None:
    """Schedulers stopped for 10 ticks on a controlled clock, then started: the
    gap's job count is 0 (skip), 1 (last), 3 (catch up 3) and 10 (catch up 20)."""
    clock = tmp_path / "clock"
    t0 = 1_900_000_000
    set_clock(clock, t0 + 0.1)
    fleet = Fleet(tmp_path, stack, store_url, clock=clock)
    names = ",".join(GAP_POLICIES)
    store = App(store_url)
    stack.callback(store.close)

    def cursors_reach(tick: int) -> None:
        def reached() -> bool:
            states = store.backend.schedule_states()
            return len(states) == len(GAP_POLICIES) and all(s.cursor == tick for s in states)

        wait_until(reached, timeout_s=30)

    first = [fleet.scheduler(names), fleet.scheduler(names)]
    cursors_reach(t0)
    set_clock(clock, t0 + 1.1)
    cursors_reach(t0 + 1)
    for proc in first:
        fleet.stop(proc)
    set_clock(clock, t0 + 11.5)  # ticks t0+2 .. t0+11 fall while no scheduler runs
    second = [fleet.scheduler(names), fleet.scheduler(names)]
    cursors_reach(t0 + 11)
    set_clock(clock, t0 + 12.1)
    cursors_reach(t0 + 12)
    for proc in second:
        fleet.stop(proc)

    gap = range(t0 + 2, t0 + 12)
    expected = {
        "gap-skip": [],
        "gap-last": [t0 + 11],
        "gap-3": [t0 + 9, t0 + 10, t0 + 11],
        "gap-20": list(gap),
    }
    for name, in_gap in expected.items():
        ticks = ticks_of(store, name)
        assert sorted(ticks) == [t0, t0 + 1, *in_gap, t0 + 12], name
