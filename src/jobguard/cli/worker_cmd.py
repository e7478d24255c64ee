"""``jobguard worker``: run a worker process."""

from __future__ import annotations

import signal
import threading
from types import FrameType

import click

from jobguard.cli.jobs_cmd import SECONDS
from jobguard.cli.state import CliState
from jobguard.worker import MAX_CONCURRENCY, MAX_PREFETCH, Worker


def _stop_on_signals(runner: Worker) -> None:
    """Make SIGTERM/SIGINT a graceful stop for the rest of the process's life.

    ``Worker.run`` installs its own handlers, but only while it runs; a signal that arrives
    before (while the app and store are being set up) or after (while the process exits) would
    otherwise kill the process mid-way.
    """
    if threading.current_thread() is not threading.main_thread():
        return

    def stop(signum: int, frame: FrameType | None) -> None:
        runner.stop()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, stop)


@click.command()
@click.option(
    "--queues",
    "-q",
    default="",
    help="Comma-separated queues in priority order (default: every registered task's queue).",
)
@click.option(
    "--concurrency",
    "-c",
    default=4,
    show_default=True,
    type=click.IntRange(1, MAX_CONCURRENCY),
    help="Handler threads.",
)
@click.option(
    "--prefetch",
    default=None,
    type=click.IntRange(0, MAX_PREFETCH),
    help="Extra leased jobs buffered beyond concurrency (default: = concurrency).",
)
@click.option(
    "--grace-s",
    default=30.0,
    show_default=True,
    type=SECONDS,
    help="On SIGTERM, how long running jobs may take before their leases are released.",
)
@click.option("--burst", is_flag=True, help="Exit once no job is ready and none is running.")
@click.option("--worker-id", default=None, help="Name in the attempt log (default host:pid:rand).")
@click.option(
    "--retention-s",
    default=None,
    type=SECONDS,
    help="Delete completed jobs finished longer ago than this (default: keep them).",
)
@click.pass_obj
def worker(
    state: CliState,
    queues: str,
    concurrency: int,
    prefetch: int | None,
    grace_s: float,
    burst: bool,
    worker_id: str | None,
    retention_s: float | None,
) -> None:
    """Fetch and run jobs until SIGTERM/SIGINT (graceful) or, with --burst, until idle."""
    app = state.app_with_tasks()
    names = [q.strip() for q in queues.split(",") if q.strip()] or None
    runner = app.worker(
        names,
        concurrency=concurrency,
        prefetch=prefetch,
        grace_s=grace_s,
        worker_id=worker_id,
        retention_s=retention_s,
    )
    _stop_on_signals(runner)
    # Printed once a signal is handled gracefully, so it also tells scripts "ready".
    click.echo(f"worker {runner.worker_id} on queues {', '.join(runner.queues)}", err=True)
    stats = runner.run(burst=burst)
    # The work is done and the process is exiting: a late signal must not turn a clean stop
    # into death by signal (the interpreter resets Python-level handlers while it shuts down).
    for sig in (signal.SIGTERM, signal.SIGINT):
        if threading.current_thread() is threading.main_thread():
            signal.signal(sig, signal.SIG_IGN)
    summary = ", ".join(f"{k}={v}" for k, v in sorted(stats.outcomes.items())) or "no jobs"
    click.echo(f"worker stopped: {summary}; released {stats.released}", err=True)
    if runner.failure is not None:
        # The store cannot be used (exit 3), or the worker could not keep its leases (exit 1).
        raise runner.failure
