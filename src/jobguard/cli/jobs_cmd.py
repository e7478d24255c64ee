"""``jobguard enqueue``, ``jobguard jobs`` and ``jobguard attempts``.

Also the output helpers the other inspection commands share: rich tables for people, ``--json``
for machines (the fields of the frozen models in :mod:`jobguard.models`, times as epoch seconds).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Iterable, Sequence
from typing import Any

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from jobguard.cli.state import CliState
from jobguard.core import checks
from jobguard.core.text import escape_controls, utc_text
from jobguard.exceptions import NotFoundError, PayloadError
from jobguard.models import Attempt, Job, JobStatus

# Ranges of the numeric options, so an out-of-range number is a usage error, not a traceback.
JOB_ID = click.IntRange(1, checks.MAX_ID)
LIMIT = click.IntRange(1, checks.MAX_COUNT)
PRIORITY = click.IntRange(checks.MIN_PRIORITY, checks.MAX_PRIORITY)
SECONDS = click.FloatRange(0, checks.MAX_DURATION_S)

# -- output helpers (shared with dlq_cmd) -------------------------------------------------------


def console() -> Console:
    """A console on the current stdout; user text is never read as rich markup.

    Output that is not a terminal (a pipe, a file, a test) gets 160 columns unless ``COLUMNS``
    says otherwise, so tables of keys and errors are not folded into slivers.
    """
    out = Console(highlight=False)
    if not out.is_terminal and "COLUMNS" not in os.environ:
        out = Console(highlight=False, width=160)
    return out


def json_text(value: Any) -> str:
    """Models (dataclasses), lists of them or plain values as indented, strict JSON: a number
    JSON cannot hold (an infinite or NaN float, as a planted row may carry) becomes ``null``."""
    return json.dumps(_plain(value), indent=2, allow_nan=False)


def emit_json(value: Any) -> None:
    """Print :func:`json_text` of ``value``."""
    click.echo(json_text(value))


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _plain(dataclasses.asdict(value))
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    if isinstance(value, bytes):  # a payload planted as a BLOB: shown, not a TypeError
        return value.decode("utf-8", "backslashreplace")
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def when(ts: float | None) -> str:
    """Store seconds as ``YYYY-MM-DD HH:MM:SS`` UTC; ``-`` for none."""
    if ts is None:
        return "-"
    return utc_text(ts)


def duration(seconds: float | None) -> str:
    """A duration in ms below one second, else in seconds; ``-`` for none."""
    if seconds is None:
        return "-"
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.2f} s"


def dash(value: object) -> str:
    """``-`` for ``None``, else the value as text."""
    return "-" if value is None else str(value)


def safe_text(text: str, style: str = "", *, keep_lines: bool = False) -> Text:
    """Stored text for the terminal: control characters shown as escapes, never sent raw.

    Error messages, keys and payloads come from handlers and producers; an escape sequence in
    one must not retitle, recolour or clear the operator's terminal.
    """
    return Text(escape_controls(text, keep_lines=keep_lines), style=style)


def table(title: str, columns: Sequence[str], rows: Iterable[Sequence[object]]) -> Table:
    """A rich table whose cells are plain text (no markup from stored strings).

    A cell keeps its line breaks: inside its box they cannot pass for lines of the output, so
    a list of fire times or a multi-line error reads as lines; every other control character
    is still escaped.
    """
    grid = Table(title=safe_text(title), title_justify="left")  # titles quote keys too
    for name in columns:
        grid.add_column(name, overflow="fold")
    for row in rows:
        grid.add_row(*(safe_text(dash(cell), keep_lines=True) for cell in row))
    return grid


def jobs_table(title: str, jobs: Sequence[Job]) -> Table:
    """Jobs as a table: one row each, with the reason it failed if it did."""
    return table(
        title,
        [
            "id",
            "task",
            "queue",
            "status",
            "attempts",
            "prio",
            "operation key",
            "created (UTC)",
            "error",
        ],
        (
            [
                job.id,
                job.task,
                job.queue,
                job.status.value,
                f"{job.attempts}/{job.max_attempts}",
                job.priority,
                job.operation_key,
                when(job.created_at),
                job.dead_reason or job.last_error,
            ]
            for job in jobs
        ),
    )


def attempts_table(title: str, attempts: Sequence[Attempt]) -> Table:
    """The attempt log (G10.1) as a table, one row per delivery."""
    return table(
        title,
        [
            "job",
            "#",
            "worker",
            "outcome",
            "started (UTC)",
            "duration",
            "lock owner",
            "fence",
            "steps run/skipped",
            "error",
        ],
        (
            [
                a.job_id,
                a.attempt,
                # A guarded host task's attempt names the host's own delivery too.
                f"{a.worker_id} {a.host_delivery}" if a.host_delivery else a.worker_id,
                a.outcome.value,
                when(a.started_at),
                duration(a.duration_s),
                a.lock_owner,
                a.fence,
                f"{a.steps_run}/{'?' if a.never_reported else a.steps_skipped}",
                f"{a.error_type}: {a.error_message}" if a.error_type else None,
            ]
            for a in attempts
        ),
    )


def parse_kwargs(ctx: click.Context, param: click.Parameter, value: str) -> dict[str, Any]:
    """``--kwargs``: a JSON object of the task's arguments."""
    try:
        parsed = json.loads(value)
    except ValueError as exc:
        raise click.BadParameter(f"not valid JSON ({exc})", ctx, param) from exc
    except RecursionError:
        raise click.BadParameter("nests too deeply to decode", ctx, param) from None
    if not isinstance(parsed, dict):
        raise click.BadParameter(
            f"must be a JSON object like '{{\"order_id\": 1}}', not {type(parsed).__name__}",
            ctx,
            param,
        )
    return parsed


# -- commands -----------------------------------------------------------------------------------


@click.command()
@click.argument("task_name", metavar="TASK")
@click.option(
    "--kwargs",
    "kwargs",
    default="{}",
    show_default=True,
    callback=parse_kwargs,
    metavar="JSON",
    help="The task's arguments as a JSON object.",
)
@click.option("--dedup-key", default=None, help="Producer-side deduplication key (G6).")
@click.option(
    "--dedup-window-s",
    default=None,
    type=SECONDS,
    help="Hold the dedup key this long after completion (default: the task's).",
)
@click.option(
    "--delay-s",
    default=0.0,
    show_default=True,
    type=SECONDS,
    help="Do not run before this many seconds from now.",
)
@click.option(
    "--priority",
    default=None,
    type=PRIORITY,
    help="Higher runs first within a queue (default: the task's).",
)
@click.option("--queue", default=None, help="Override the task's queue.")
@click.option("--json", "as_json", is_flag=True, help="Print the job as JSON.")
@click.pass_obj
def enqueue(
    state: CliState,
    task_name: str,
    kwargs: dict[str, Any],
    dedup_key: str | None,
    dedup_window_s: float | None,
    delay_s: float,
    priority: int | None,
    queue: str | None,
    as_json: bool,
) -> None:
    """Enqueue a job of TASK (a registered task name) and print its id.

    With --dedup-key, an enqueue while another job holds the key returns that job instead
    (deduplicated) and stores nothing new.
    """
    app = state.app_with_tasks()
    try:
        job = app.enqueue(
            task_name,
            kwargs,
            dedup_key=dedup_key,
            dedup_window_s=dedup_window_s,
            delay_s=delay_s,
            priority=priority,
            queue=queue,
        )
    except PayloadError as exc:
        raise PayloadError(f"--kwargs: {exc}") from exc
    if as_json:
        emit_json(job)
    elif job.deduplicated:
        click.echo(
            f"job {job.id} deduplicated: it already holds dedup key "
            f"{escape_controls(repr(job.dedup_key))} ({job.status}); nothing new was enqueued"
        )
    else:
        click.echo(f"job {job.id} enqueued: {job.task} on queue {job.queue}")


@click.command()
@click.option(
    "--status",
    type=click.Choice([s.value for s in JobStatus]),
    default=None,
    help="Only jobs in this state.",
)
@click.option(
    "--limit",
    default=50,
    show_default=True,
    type=LIMIT,
    help="At most this many jobs, newest first.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the jobs as a JSON list.")
@click.pass_obj
def jobs(state: CliState, status: str | None, limit: int, as_json: bool) -> None:
    """List jobs, newest first, with a count per state."""
    app = state.inspecting_app()
    found = app.jobs(status, limit)
    if as_json:
        emit_json(found)
        return
    out = console()
    out.print(jobs_table(f"jobs ({status or 'all states'})", found))
    counts = app.counts()
    out.print("  ".join(f"{s.value} {counts[s]}" for s in JobStatus))
    paused = [p.queue for p in app.paused_queues()]
    if paused:
        out.print(safe_text(f"paused queues (no job of theirs starts): {', '.join(paused)}"))


@click.command()
@click.option("--job", "job_id", type=JOB_ID, default=None, help="The attempts of this job.")
@click.option(
    "--operation",
    "operation_key",
    default=None,
    metavar="KEY",
    help="The attempts of every job with this operation key.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the attempts as a JSON list.")
@click.pass_obj
def attempts(state: CliState, job_id: int | None, operation_key: str | None, as_json: bool) -> None:
    """Show the attempt log (G10.1) of one job (--job) or one operation (--operation)."""
    if (job_id is None) == (operation_key is None):
        raise click.UsageError("give exactly one of --job ID or --operation KEY")
    app = state.inspecting_app()
    if job_id is not None:
        app.get_job(job_id)  # NotFoundError (exit 1) for an id that does not exist
        found = app.attempts(job_id=job_id)
        title = f"attempts of job {job_id}"
    else:
        assert operation_key is not None
        found = app.attempts(operation_key=operation_key)
        if not found and app.operation(operation_key) is None:
            raise NotFoundError(f"no attempt and no operation record for {operation_key!r}")
        title = f"attempts of operation {operation_key}"
    if as_json:
        emit_json(found)
        return
    console().print(attempts_table(title, found))
