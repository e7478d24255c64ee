"""``jobguard dlq list|show|replay|purge``: the dead letter queue (G8.1, G8.3)."""

from __future__ import annotations

from typing import Any

import click

from jobguard.cli.dlq_bulk import actor, build_selection, confirm_selection, selection_options
from jobguard.cli.jobs_cmd import (
    JOB_ID,
    LIMIT,
    attempts_table,
    console,
    emit_json,
    jobs_table,
    json_text,
    safe_text,
    when,
)
from jobguard.cli.state import CliState
from jobguard.core.jsonvalues import decode_object
from jobguard.exceptions import NotFoundError


@click.group()
def dlq() -> None:
    """Inspect, replay and purge the dead letter queue (G8)."""


@dlq.command(name="list")
@click.option(
    "--limit",
    default=100,
    show_default=True,
    type=LIMIT,
    help="At most this many dead jobs, most recently buried first.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the dead jobs as a JSON list.")
@click.pass_obj
def list_dead(state: CliState, limit: int, as_json: bool) -> None:
    """List dead jobs with the reason each was buried."""
    found = state.inspecting_app().dlq.list(limit)
    if as_json:
        emit_json(found)
        return
    console().print(jobs_table(f"dead letter queue ({len(found)} shown)", found))


@dlq.command()
@click.argument("job_id", type=JOB_ID, metavar="ID")
@click.option("--json", "as_json", is_flag=True, help="Print the dead job as JSON.")
@click.pass_obj
def show(state: CliState, job_id: int, as_json: bool) -> None:
    """Show a dead job: reason, payload and every attempt with its traceback."""
    dead = state.inspecting_app().dlq.show(job_id)
    if as_json:
        emit_json(dead)
        return
    job = dead.job
    out = console()
    lines = [
        f"dead job {job.id}: {job.task} on queue {job.queue}",
        f"reason:        {dead.reason}",
        f"attempts:      {job.attempts}/{job.max_attempts} (deferrals {job.deferrals})",
        f"operation key: {job.operation_key or '-'}",
        f"resource key:  {job.resource_key or '-'}",
        f"dedup key:     {job.dedup_key or '-'}",
        *(
            [f"concurrency:   {job.concurrency_key} (at most {job.concurrency_limit} at once)"]
            if job.concurrency_key
            else []
        ),
        f"created:       {when(job.created_at)} UTC",
        f"buried:        {when(job.finished_at)} UTC",
        "payload:",
    ]
    for line in lines:
        out.print(safe_text(line))
    out.print(safe_text(_payload_text(job.payload), keep_lines=True))
    out.print(attempts_table(f"attempts of job {job.id}", dead.attempts))
    for attempt in dead.attempts:
        if attempt.traceback:
            out.print()
            out.print(safe_text(f"traceback of attempt {attempt.attempt} ({attempt.worker_id}):"))
            out.print(safe_text(attempt.traceback.rstrip(), keep_lines=True))


def _payload_text(payload: Any) -> str:
    """The payload indented if it is a JSON object, else as stored (a planted row: anything)."""
    decoded = decode_object(payload)
    if isinstance(decoded, str):
        return f"{payload!r} ({decoded})"
    return json_text(decoded)


@dlq.command()
@click.argument("job_id", type=JOB_ID, metavar="ID", required=False)
@selection_options
@click.pass_obj
def replay(
    state: CliState,
    /,
    job_id: int | None,
    every: bool,
    yes: bool,
    batch_size: int,
    **filters: str | None,
) -> None:
    """Queue dead job ID again, or every dead job a filter (or --all) selects (G8.3).

    Same id, arguments and keys, attempts reset; the operation key is kept, so work that
    already completed is not redone. A bulk replay shows what it selects and asks first; each
    job is replayed once even if another operator replays the same jobs at the same time.
    """
    selection = build_selection(job_id, every, filters)
    app = state.inspecting_app()
    if selection is None:
        assert job_id is not None
        job = app.dlq.replay(job_id, actor=actor())
        console().print(
            safe_text(
                f"job {job.id} replayed: {job.status}, operation key {job.operation_key or '-'}"
            )
        )
        return
    preview = confirm_selection(app, selection, "Replay", yes)
    if preview.count == 0:
        click.echo("nothing replayed")
        return
    report = app.replay_dead(preview.selection, actor=actor(), batch_size=batch_size)
    for dead_id, holder_id in report.held:
        click.echo(
            f"job {dead_id} not replayed: job {holder_id} holds its dedup key "
            "(replaying would run the same work twice)"
        )
    if report.gone:
        click.echo(f"{report.gone} had already left the dead letter queue (skipped)")
    count = len(report.replayed)
    click.echo(f"replayed {count} dead job{'s' if count != 1 else ''}")


@dlq.command()
@click.argument("job_id", type=JOB_ID, metavar="ID", required=False)
@selection_options
@click.pass_obj
def purge(
    state: CliState,
    /,
    job_id: int | None,
    every: bool,
    yes: bool,
    batch_size: int,
    **filters: str | None,
) -> None:
    """Delete dead job ID, or every dead job a filter (or --all) selects, with their attempt
    rows, for good. Asks first unless --yes."""
    selection = build_selection(job_id, every, filters)
    app = state.inspecting_app()
    if selection is None:
        assert job_id is not None
        app.dlq.show(job_id)  # NotFoundError (exit 1) unless the job is dead
        if not yes:
            click.confirm(f"Delete dead job {job_id} and its attempts?", abort=True, err=True)
        purged = app.dlq.purge(job_id, actor=actor())
        if purged == 0:
            raise NotFoundError(f"job {job_id} left the dead letter queue before it was purged")
    else:
        preview = confirm_selection(app, selection, "Purge", yes)
        if preview.count == 0:
            click.echo("nothing purged")
            return
        purged = app.purge_dead(preview.selection, actor=actor(), batch_size=batch_size)
    click.echo(f"purged {purged} dead job{'s' if purged != 1 else ''}")
