"""Concurrency limits with real worker processes and SIGKILLs on both stores (#17, G3.6).

Four worker processes of two handler threads each run jobs of two accounts whose task allows
three runs per account at once. Two workers are SIGKILLed while their handlers run (their slots
are freed only by their TTL) and restarted. How many handlers ran at once is measured from the
handlers' own event log (``tests.support.queue_app``): a handler runs from its ``start`` event
to its ``end`` event, or, killed, to the moment the test saw its process dead.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from jobguard import App
from jobguard.models import JobStatus, Outcome
from tests.support.procs import WorkerProcess, spawn_worker, wait_until, workers
from tests.support.queue_app import SLOT_LIMIT, SLOTTED, Event, make_app, read_events

pytestmark = pytest.mark.chaos

APP_MODULE = "tests.support.queue_app"
ACCOUNTS = (1, 2)
JOBS_PER_ACCOUNT = 16
SLEEP_S = 0.4


@pytest.fixture
def qapp(store_url: str) -> Iterator[App]:
    application = make_app(store_url)
    _ = application.backend
    yield application
    application.close()


def start(store_url: str, name: str) -> WorkerProcess:
    proc = spawn_worker(store_url, APP_MODULE, worker_id=name, concurrency=2, prefetch=0)
    proc.wait_ready()
    return proc


def running_in(store_url: str, pid: int) -> bool:
    """Whether a handler of process ``pid`` has started and not ended."""
    events = [e for e in read_events(store_url) if e.pid == pid]
    started = {(e.job_id, e.attempt) for e in events if e.kind == "start"}
    ended = {(e.job_id, e.attempt) for e in events if e.kind == "end"}
    return bool(started - ended)


def kill(proc: WorkerProcess, killed_at: dict[int, float]) -> None:
    """SIGKILL and reap; note when the process was seen dead (at or after its death)."""
    proc.kill()
    killed_at[proc.pid] = time.time()


def runs(events: list[Event], killed_at: dict[int, float]) -> list[tuple[int, float, float]]:
    """``(job_id, start, end)`` of every handler run; a killed one ends when its process did."""
    ends = {(e.job_id, e.attempt): e.t for e in events if e.kind == "end"}
    found = []
    for event in events:
        if event.kind != "start":
            continue
        end = ends.get((event.job_id, event.attempt), killed_at.get(event.pid))
        assert end is not None, f"a handler neither ended nor was killed: {event}"
        found.append((event.job_id, event.t, end))
    return found


def most_at_once(intervals: list[tuple[float, float]]) -> int:
    """The largest number of intervals open at one moment (the most is reached at a start)."""
    return max(sum(1 for s, e in intervals if s <= start < e) for start, _ in intervals)


def test_no_more_than_the_limit_run_at_once_per_key_through_sigkills_and_no_job_is_lost(
    qapp: App, store_url: str
) -> None:
    task = qapp.tasks[SLOTTED]
    account_of: dict[int, int] = {}

    def enqueue_half() -> None:
        # Each kill round brings its own work, so a handler is running when the round looks
        # for one, however long the workers took to start.
        for _ in range(JOBS_PER_ACCOUNT // 2):
            for account in ACCOUNTS:
                account_of[task.enqueue(account=account, sleep_s=SLEEP_S).id] = account

    killed_at: dict[int, float] = {}
    procs = [start(store_url, f"w{n}") for n in range(4)]
    spares: list[WorkerProcess] = []
    with workers(*procs):
        try:
            for round_ in range(2):
                enqueue_half()
                # A worker killed while one of its handlers holds a slot: only the TTL frees it.
                live = [p for p in procs + spares if p.pid not in killed_at]
                found: list[WorkerProcess] = []
                wait_until(
                    lambda live=live, found=found: bool(
                        found.extend(p for p in live if running_in(store_url, p.pid)) or found
                    ),
                    timeout_s=60,
                )
                kill(found[0], killed_at)
                spares.append(start(store_url, f"again{round_}"))
            wait_until(
                lambda: all(
                    qapp.get_job(job_id).status == JobStatus.COMPLETED for job_id in account_of
                ),
                timeout_s=120,
            )
        finally:
            for proc in spares:
                proc.kill()

    events = read_events(store_url)
    by_account: dict[int, list[tuple[float, float]]] = {account: [] for account in ACCOUNTS}
    for job_id, began, ended in runs(events, killed_at):
        by_account[account_of[job_id]].append((began, ended))
    most = {account: most_at_once(intervals) for account, intervals in by_account.items()}
    assert all(n <= SLOT_LIMIT for n in most.values()), most
    assert SLOT_LIMIT in most.values(), most  # the limit was reached, not merely never tested
    # Two handlers died with their workers; their jobs ran again and completed. None was lost.
    killed_pids = set(killed_at)
    killed_runs = [e for e in events if e.kind == "start" and e.pid in killed_pids]
    assert len(killed_runs) >= 2
    ended_jobs = {e.job_id for e in events if e.kind == "end"}
    assert ended_jobs == set(account_of)
    outcomes = [a.outcome for job_id in account_of for a in qapp.attempts(job_id=job_id)]
    assert Outcome.LOST in outcomes
    assert Outcome.DEAD not in outcomes
    # No slot is held any more: given back at the end of each run, or (a killed worker's,
    # unless its slot was granted again since) expired.
    now = qapp.backend.now()
    for account in ACCOUNTS:
        grants = qapp.backend.slot_grants(f"account:{account}")
        assert len(grants) == SLOT_LIMIT
        assert all(g.owner == "" or g.expires_at <= now for g in grants), grants
