"""``jobguard worker``: run a worker process."""

from __future__ import annotations

from typing import Any

import click

from jobguard.app import App
from jobguard.cli.jobs_cmd import SECONDS
from jobguard.cli.signals import stop_on_signals
from jobguard.cli.state import CliState
from jobguard.core import checks
from jobguard.hooks import HookChain, Hooks
from jobguard.process import ignore_stop_signals
from jobguard.supervisor import MAX_PROCESSES, ProcessWorker
from jobguard.worker import MAX_CONCURRENCY, MAX_PREFETCH, Worker


def _observe(app: App, metrics_port: int | None, host: str, log_json: bool) -> str | None:
    """Add the metrics and JSON-log hooks the options ask for; return the metrics URL."""
    added: list[Hooks] = []
    url = None
    if metrics_port is not None:
        from jobguard.observability.metrics import MetricsHooks, serve

        metrics = MetricsHooks()
        metrics.declare(app.tasks.values())  # every task's series at 0 before its first job
        bound_host, bound_port = serve(metrics.registry, metrics_port, host)
        url = f"http://{bound_host}:{bound_port}/metrics"
        added.append(metrics)
    if log_json:
        from jobguard.observability.logs import JsonLogHooks, install_json_handler

        install_json_handler()
        added.append(JsonLogHooks())
    if added:
        app.hooks = HookChain(app.hooks, *added)
    return url


def _threads_only(ctx: click.Context, *names: str) -> None:
    """Options of thread mode given with --processes: say so (each slot runs one job)."""
    for name in names:
        if ctx.get_parameter_source(name) is not click.core.ParameterSource.DEFAULT:
            raise click.UsageError(
                f"--{name} sets handler threads; with --processes each slot is a process "
                "running one job at a time"
            )


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
    "--processes",
    "-p",
    default=None,
    type=click.IntRange(1, MAX_PROCESSES),
    help="Run each slot as a child process, one job at a time (enforces hard time limits); "
    "instead of --concurrency threads.",
)
@click.option(
    "--time-limit-s",
    default=None,
    type=click.FloatRange(0, checks.MAX_DURATION_S, min_open=True),
    help="Hard limit of a run whose job has none: the slot running longer is killed and "
    "replaced, the attempt timed out (needs --processes).",
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
@click.option(
    "--metrics-port",
    default=None,
    type=click.IntRange(0, 65535),
    help="Serve Prometheus metrics at http://HOST:PORT/metrics (0 picks a free port).",
)
@click.option(
    "--metrics-host",
    default="127.0.0.1",
    show_default=True,
    help="Address the metrics endpoint binds to.",
)
@click.option("--log-json", is_flag=True, help="Log one JSON line per attempt event on stderr.")
@click.option(
    "--schedule",
    is_flag=True,
    help="Also enqueue the ticks of the app's periodic tasks (a scheduler thread).",
)
@click.pass_obj
def worker(
    state: CliState,
    queues: str,
    concurrency: int,
    processes: int | None,
    time_limit_s: float | None,
    prefetch: int | None,
    grace_s: float,
    burst: bool,
    worker_id: str | None,
    retention_s: float | None,
    metrics_port: int | None,
    metrics_host: str,
    log_json: bool,
    schedule: bool,
) -> None:
    """Fetch and run jobs until SIGTERM/SIGINT (graceful) or, with --burst, until idle."""
    app = state.app_with_tasks()
    names = [q.strip() for q in queues.split(",") if q.strip()] or None
    metrics_url = _observe(app, metrics_port, metrics_host, log_json)
    # What both modes take: a slot of a process worker is a worker of one handler thread.
    shared: dict[str, Any] = {
        "grace_s": grace_s,
        "worker_id": worker_id,
        "retention_s": retention_s,
        "schedule": schedule,
    }
    runner: Worker | ProcessWorker
    if processes is None:
        if time_limit_s is not None:
            raise click.UsageError(
                "--time-limit-s is a hard limit, which needs --processes: a thread cannot be "
                "stopped from outside"
            )
        runner = app.worker(names, concurrency=concurrency, prefetch=prefetch, **shared)
    else:
        _threads_only(click.get_current_context(), "concurrency", "prefetch")
        runner = app.process_worker(names, processes=processes, time_limit_s=time_limit_s, **shared)
    # For the rest of the process's life: Worker.run installs its own handlers only while it
    # runs, and a signal before (while the store opens) or after (while the process exits)
    # would otherwise kill the process mid-way.
    stop_on_signals(runner.stop)
    if metrics_url is not None:
        click.echo(f"metrics at {metrics_url}", err=True)
    # A store it cannot write (a read-only file) is said in one line, before it announces itself.
    app.backend.check_usable()
    # Printed once a signal is handled gracefully, so it also tells scripts "ready".
    click.echo(f"worker {runner.worker_id} on queues {', '.join(runner.queues)}", err=True)
    stats = runner.run(burst=burst)
    # The work is done and the process is exiting: a late signal must not turn a clean stop
    # into death by signal (the interpreter resets Python-level handlers while it shuts down).
    ignore_stop_signals()
    summary = ", ".join(f"{k}={v}" for k, v in sorted(stats.outcomes.items())) or "no jobs"
    click.echo(f"worker stopped: {summary}; released {stats.released}", err=True)
    if runner.failure is not None:
        # The store cannot be used (exit 3), or the worker could not keep its leases (exit 1).
        raise runner.failure
