"""The guard's store is opened once, where the guard is made, and every process that runs its
deliveries uses that one object with connections of its own: a process forked for each job (RQ's
work horse) neither opens nor checks the store again, and a guard closed in a process opens its
connections again when it is used there."""

from __future__ import annotations

import os
from typing import Any

import jobguard
from jobguard.hosts.guard import Verdict
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
