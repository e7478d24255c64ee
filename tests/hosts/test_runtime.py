"""The guard's store is opened once, where the guard is made, and every process that runs its
deliveries uses that one object with connections of its own: a process forked for each job (RQ's
work horse) neither opens nor checks the store again, and a guard closed in a process opens its
connections again when it is used there. The endings of deliveries that end together in one
process are written together."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import jobguard
from jobguard.hosts.guard import Gathering, Verdict
from jobguard.hosts.rq import RQGuard
from jobguard.models import Outcome

TASK = "runtime.noted"


def make_guard(store_url: str) -> RQGuard:
    guard = RQGuard(jobguard.App(store_url))

    @guard.job(name=TASK, operation_key="noted:{n}")
    def noted(ctx: Any, n: int) -> int:
        return int(ctx.step("note", lambda: n))

    return guard


def run_in_forked_child(guard: RQGuard, n: int) -> str:
    """Run one delivery in a child forked from this process, as RQ runs a job; what it saw."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the work horse: report, then leave as RQ's does (no cleanup of the parent's)
        try:
            verdict = guard.run(TASK, {"n": n}, f"horse-{n}")
            shared = guard.runtime().backend is guard.backend
            os.write(write_end, f"{verdict.verdict} {shared}".encode())
        finally:
            os._exit(0)
    os.close(write_end)
    try:
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        return os.read(read_end, 200).decode()
    finally:
        os.close(read_end)


def test_a_forked_work_horse_runs_on_the_guards_store_and_the_parent_keeps_its_own(
    store_url: str,
) -> None:
    guard = make_guard(store_url)
    try:
        # Forked before this process used the store, as RQ's worker forks its work horses.
        assert run_in_forked_child(guard, 1) == f"{Verdict.ACK} True"
        assert run_in_forked_child(guard, 2) == f"{Verdict.ACK} True"
        assert guard.run(TASK, {"n": 3}, "parent").verdict == Verdict.ACK
        # A child forked while this process holds connections opens its own.
        assert run_in_forked_child(guard, 4) == f"{Verdict.ACK} True"
        assert guard.run(TASK, {"n": 5}, "parent").verdict == Verdict.ACK
        guard.close()
        assert guard.run(TASK, {"n": 6}, "after-close").verdict == Verdict.ACK  # reopened
        attempts = guard.backend.attempts()
    finally:
        guard.close()
    assert sorted(a.operation_key for a in attempts) == [f"noted:{n}" for n in range(1, 7)]
    assert all(a.outcome == Outcome.COMPLETED for a in attempts)


class RecordingSettler:
    """Stands in for the worker's settler: records each batch; the first one waits until told."""

    def __init__(self, fail_on: str | None = None) -> None:
        self.batches: list[list[str]] = []
        self.first_started = threading.Event()
        self.release_first = threading.Event()
        self.fail_on = fail_on

    def settle(self, pending: list[tuple[Any, Any]]) -> list[Any]:
        names = [ending for _, ending in pending]
        self.batches.append(names)
        if len(self.batches) == 1:
            self.first_started.set()
            assert self.release_first.wait(10)
        if self.fail_on in names:
            raise RuntimeError(f"settle of {names} failed")
        return [f"final-{name}" for name in names]


def settle_in_threads(
    gathering: Gathering, settler: RecordingSettler, later: list[str]
) -> dict[str, str]:
    """``first`` settles and is held; ``later`` end meanwhile; then ``first`` is let go."""
    results: dict[str, str] = {}

    def settle(name: str) -> None:
        try:
            results[name] = gathering.settle(None, name)  # type: ignore[arg-type]
        except RuntimeError as exc:
            results[name] = f"error: {exc}"

    threads = [threading.Thread(target=settle, args=("first",))]
    threads[0].start()
    assert settler.first_started.wait(10)
    for name in later:
        threads.append(threading.Thread(target=settle, args=(name,)))
        threads[-1].start()
    deadline = time.monotonic() + 10
    while len(gathering._gathered) < len(later):  # every later one waits for its turn
        assert time.monotonic() < deadline
        time.sleep(0.001)
    settler.release_first.set()
    for thread in threads:
        thread.join(10)
    return results


def test_endings_that_end_while_one_is_written_are_written_together_after_it() -> None:
    settler = RecordingSettler()
    gathering = Gathering(settler)  # type: ignore[arg-type]
    results = settle_in_threads(gathering, settler, ["b", "c", "d"])
    assert settler.batches[0] == ["first"]
    assert sorted(settler.batches[1]) == ["b", "c", "d"]  # one settle: one commit for three
    assert len(settler.batches) == 2
    assert results == {name: f"final-{name}" for name in ("first", "b", "c", "d")}
    assert gathering.settle(None, "alone") == "final-alone"  # type: ignore[arg-type]
    assert settler.batches[-1] == ["alone"]


def test_a_batch_that_fails_fails_every_delivery_in_it_and_the_next_one_is_written() -> None:
    settler = RecordingSettler(fail_on="b")
    gathering = Gathering(settler)  # type: ignore[arg-type]
    results = settle_in_threads(gathering, settler, ["b", "c"])
    assert results["first"] == "final-first"
    assert results["b"] == results["c"]
    assert results["b"].startswith("error: settle of")
    assert gathering.settle(None, "next") == "final-next"  # type: ignore[arg-type]
