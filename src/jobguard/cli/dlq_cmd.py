"""``jobguard dlq list|show|replay|purge``: the dead letter queue (G8.1, G8.3)."""

from __future__ import annotations

import json
from typing import Any

import click

from jobguard.cli.jobs_cmd import (
    JOB_ID,
    LIMIT,
    attempts_table,
    console,
    emit_json,
    jobs_table,
    safe_text,
    when,
)
from jobguard.cli.state import CliState
from jobguard.core.jsonvalues import decode_object
from jobguard.exceptions import NotFoundError
from jobguard.models import JobStatus


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
    return json.dumps(decoded, indent=2)


@dlq.command()
@click.argument("job_id", type=JOB_ID, metavar="ID")
@click.pass_obj
def replay(state: CliState, job_id: int) -> None:
    """Queue dead job ID again: same id, arguments and keys, attempts reset (G8.3).

    Its operation key is kept, so work that already completed is not redone.
    """
    job = state.inspecting_app().dlq.replay(job_id)
    console().print(
        safe_text(f"job {job.id} replayed: {job.status}, operation key {job.operation_key or '-'}")
    )


@dlq.command()
@click.argument("job_id", type=JOB_ID, metavar="ID", required=False)
@click.option("--all", "purge_all", is_flag=True, help="Purge every dead job.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@click.pass_obj
def purge(state: CliState, job_id: int | None, purge_all: bool, yes: bool) -> None:
    """Delete dead job ID (or --all dead jobs) with their attempt rows, for good."""
    if (job_id is None) == (not purge_all):
        raise click.UsageError("give exactly one of a job ID or --all")
    app = state.inspecting_app()
    if job_id is not None:
        app.dlq.show(job_id)  # NotFoundError (exit 1) unless the job is dead
        question = f"Delete dead job {job_id} and its attempts?"
    else:
        count = app.counts()[JobStatus.DEAD]  # one count, not every dead row loaded
        if count == 0:
            click.echo("the dead letter queue is empty; nothing purged")
            return
        question = f"Delete all {count} dead jobs and their attempts?"
    if not yes:
        click.confirm(question, abort=True, err=True)
    purged = app.dlq.purge(job_id)
    if job_id is not None and purged == 0:
        raise NotFoundError(f"job {job_id} left the dead letter queue before it was purged")
    click.echo(f"purged {purged} dead job{'s' if purged != 1 else ''}")
