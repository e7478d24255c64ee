"""``jobguard queue pause|resume|list``: stop and restart the fetching of a queue (#17)."""

from __future__ import annotations

import getpass

import click
from rich.table import Table

from jobguard.cli.jobs_cmd import console, emit_json, safe_text, when
from jobguard.cli.state import CliState
from jobguard.task import check_queue_name


def cli_actor() -> str:
    """The audit trail's name for whoever runs the command: ``cli:`` and the login name."""
    try:
        return f"cli:{getpass.getuser()}"
    except (KeyError, OSError):  # no name for this uid (a bare container)
        return "cli"


@click.group()
def queue() -> None:
    """Pause, resume and list queues (state kept in the store, audited)."""


@queue.command()
@click.argument("name")
@click.pass_obj
def pause(state: CliState, name: str) -> None:
    """Stop workers on every host from starting jobs of queue NAME.

    Jobs already running finish; enqueues still land; the pause holds until `queue resume`.
    """
    name = check_queue_name(name)  # before the store is opened: a bad name changes nothing
    if state.app().pause_queue(name, actor=cli_actor()):
        click.echo(f"queue {name} paused: workers start none of its jobs until it is resumed")
    else:
        click.echo(f"queue {name} is already paused; nothing changed")


@queue.command()
@click.argument("name")
@click.pass_obj
def resume(state: CliState, name: str) -> None:
    """Let workers start jobs of queue NAME again."""
    name = check_queue_name(name)
    if state.app().resume_queue(name, actor=cli_actor()):
        click.echo(f"queue {name} resumed")
    else:
        click.echo(f"queue {name} was not paused; nothing changed")


@queue.command(name="list")
@click.option("--json", "as_json", is_flag=True, help="Print the queues as a JSON list.")
@click.pass_obj
def list_queues(state: CliState, as_json: bool) -> None:
    """Every queue with a job or a pause: counts and whether it is paused."""
    app = state.inspecting_app()
    stats = app.queue_stats()
    paused = {p.queue: p for p in app.paused_queues()}
    if as_json:
        emit_json(stats)
        return
    table = Table(title=f"queues ({len(stats)})")
    for column in ("queue", "state", "ready", "scheduled", "running", "dead", "paused since"):
        table.add_column(column)
    for row in stats:
        since = paused.get(row.queue)
        table.add_row(
            safe_text(row.queue),
            "paused" if row.paused else "active",
            str(row.ready),
            str(row.scheduled),
            str(row.running),
            str(row.dead),
            "-" if since is None else safe_text(f"{when(since.paused_at)} by {since.paused_by}"),
        )
    console().print(table)
