"""A concurrency limit in one worker process with real threads, on both stores (#17, G3.6).

A job over its key's limit waits without spending an attempt (deferred, as for a busy lock),
and the heartbeat keeps a running job's slot past its TTL: with a limit of one, the second job
starts only after the first one ended, although the first runs for more than two slot TTLs.
"""

from __future__ import annotations

import threading
import time

from click.testing import CliRunner

from jobguard import App, Context, JobStatus, Outcome
from jobguard.cli.main import cli
from jobguard.models import DeadCode
from jobguard.testing import drain

TTL_S = 1.0
RUN_S = 2.5  # longer than two TTLs: only renewals keep the slot


def test_over_the_limit_waits_uncharged_and_the_heartbeat_keeps_the_slot(store_url: str) -> None:
    app = App(store_url)
    seen: list[dict[str, object]] = []
    guard = threading.Lock()

    @app.task(
        name="export",
        concurrency_key="account:{account}",
        concurrency_limit=1,
        lock_ttl_s=TTL_S,
        visibility_timeout_s=30.0,
    )
    def export(ctx: Context, account: int) -> None:
        started = time.monotonic()
        time.sleep(RUN_S)
        with guard:
            seen.append(
                {
                    "job": ctx.job_id,
                    "start": started,
                    "end": time.monotonic(),
                    "slot": (ctx.concurrency_key, ctx.slot, ctx.slot_fence),
                    "lost": ctx.lease_lost,
                }
            )

    try:
        first = export.enqueue(account=7)
        second = export.enqueue(account=7)
        drain(app, concurrency=2, timeout_s=60)
        assert app.get_job(first.id).status == JobStatus.COMPLETED
        assert app.get_job(second.id).status == JobStatus.COMPLETED
        runs = sorted(seen, key=lambda run: float(str(run["start"])))
        assert [run["job"] for run in runs] == [first.id, second.id]
        assert float(str(runs[1]["start"])) >= float(str(runs[0]["end"]))  # never both at once
        assert [run["slot"] for run in runs] == [("account:7", 0, 1), ("account:7", 0, 2)]
        assert not any(run["lost"] for run in runs)
        # The second job waited as a job behind a busy lock does: deferred, never charged.
        assert app.get_job(second.id).attempts == 1
        waits = [a for a in app.attempts(job_id=second.id) if a.outcome == Outcome.DEFERRED]
        assert waits, "the second job never waited for the slot"
        assert waits[0].error_message == "concurrency limit reached: 1 running for account:7"
        assert [a.outcome for a in app.attempts(job_id=first.id)] == [Outcome.COMPLETED]
    finally:
        app.close()


def test_a_job_waiting_past_max_defer_s_for_a_slot_is_buried_saying_so(store_url: str) -> None:
    """G3.4, G3.6: waiting for a slot is bounded by ``max_defer_s`` as waiting for a lock is;
    ``jobguard dlq show`` names the key and its limit."""
    app = App(store_url)

    @app.task(
        name="export", concurrency_key="account:{account}", concurrency_limit=1, max_defer_s=0
    )
    def export(ctx: Context, account: int) -> None:
        raise AssertionError("never runs: its account's only slot is held")

    try:
        export.enqueue(account=7)
        rules = {"export": export.delivery_rules()}
        (holder,) = app.backend.fetch_prepared(["default"], 1, "holder", rules)
        assert holder.begun is not None
        assert holder.begun.slot is not None
        waiting = export.enqueue(account=7)
        app.worker(install_signal_handlers=False, grace_s=1.0).run(burst=True)
        buried = app.get_job(waiting.id)
        assert buried.status == JobStatus.DEAD
        assert buried.dead_code == DeadCode.WAITED
        shown = CliRunner().invoke(cli, ["--url", store_url, "dlq", "show", str(waiting.id)])
        assert shown.exit_code == 0, shown.output
        assert "concurrency limit reached: 1 running for account:7" in shown.output
        assert "concurrency:   account:7 (at most 1 at once)" in shown.output
    finally:
        app.close()


def test_a_handler_slot_freed_is_refilled_at_once_not_at_the_next_poll(store_url: str) -> None:
    """The fetch loop sleeps while the buffer is full and is woken when a handler frees a slot:
    with one handler and nothing buffered beyond it, each next job is leased as the last one
    ends, not a poll interval (here 5 s: six jobs would take half a minute) later."""
    app = App(store_url)

    @app.task(name="one_at_a_time")
    def one_at_a_time(ctx: Context, n: int) -> None:
        time.sleep(0.05)

    jobs = [one_at_a_time.enqueue(n=n) for n in range(6)]
    worker = app.worker(
        install_signal_handlers=False, concurrency=1, prefetch=0, poll_interval_s=5.0
    )
    running = threading.Thread(target=worker.run, daemon=True)
    running.start()
    try:
        deadline = time.monotonic() + 8.0
        while any(app.get_job(job.id).status != JobStatus.COMPLETED for job in jobs):
            assert time.monotonic() < deadline, "the next job waited for the poll"
            time.sleep(0.02)
    finally:
        worker.stop()
        running.join(30.0)
        app.close()
