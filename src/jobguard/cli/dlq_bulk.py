"""Bulk ``dlq replay`` and ``dlq purge`` (#17): the selection options, the preview, the question.

A bulk action shows how many dead jobs it will touch and the first of them, then asks, and acts
on what it showed: a job buried after the preview is left alone. ``--yes`` skips the question;
without a terminal to ask on (a script that forgot ``--yes``) nothing is done and the exit
code is 2.
"""

from __future__ import annotations

import getpass
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

from jobguard.app import App
from jobguard.cli.jobs_cmd import console, jobs_table, safe_text
from jobguard.core.selection import DeadFilter, DeadPreview

F = TypeVar("F", bound=Callable[..., Any])

PREVIEW_ROWS = 10


def selection_options(fn: F) -> F:
    """The filter options shared by ``dlq replay`` and ``dlq purge``."""
    options = [
        click.option("--task", help="Only dead jobs of this task."),
        click.option("--queue", help="Only dead jobs on this queue."),
        click.option(
            "--reason",
            help="Only dead jobs buried for this dead code "
            "(fatal, exhausted, poison, unrunnable, lost, waited, cancelled).",
        ),
        click.option("--since", help="Only jobs buried at or after this ISO 8601 time (UTC)."),
        click.option("--until", help="Only jobs buried before this ISO 8601 time (UTC)."),
        click.option("--all", "every", is_flag=True, help="Every dead job."),
        click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation."),
        click.option(
            "--batch-size",
            default=500,
            show_default=True,
            type=click.IntRange(min=1),
            help="Dead jobs per transaction.",
        ),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def build_selection(
    job_id: int | None, every: bool, filters: dict[str, str | None]
) -> DeadFilter | None:
    """The bulk selection, or ``None`` for the single job ``job_id``; usage errors otherwise."""
    given = {name: value for name, value in filters.items() if value is not None}
    if job_id is not None:
        if given or every:
            raise click.UsageError("give a job ID or filters, not both")
        return None
    if every and given:
        raise click.UsageError("--all selects every dead job; give it without filters")
    if not every and not given:
        raise click.UsageError(
            "give a job ID, a filter (--task, --queue, --reason, --since, --until) or --all"
        )
    return DeadFilter.parse(**given)  # ConfigurationError (exit 2) names a bad value


def actor() -> str:
    """Who acts, for the audit trail: the operating-system user of the CLI."""
    try:
        return f"cli:{getpass.getuser()}"
    except (OSError, KeyError, ImportError):  # no user name in this environment
        return "cli"


def confirm_selection(app: App, selection: DeadFilter, verb: str, yes: bool) -> DeadPreview:
    """Show the selection and ask; return the preview, whose ``selection`` is what to act on:
    jobs buried after it was shown are left alone. Nothing to do when its ``count`` is 0. Exits
    2 without --yes when there is no terminal to ask on, 1 when the answer is no."""
    preview = app.dlq.preview(selection, PREVIEW_ROWS)
    count = preview.count
    what = "in the dead letter queue" if selection.everything else f"match {selection.describe()}"
    plural = "s" if count != 1 else ""
    out = console()
    out.print(safe_text(f"{count} dead job{plural} {what} (buried before {preview.cutoff_text})"))
    if count == 0:
        return preview
    out.print(jobs_table(f"first {len(preview.first)} of {count}", preview.first))
    if verb == "Replay" and preview.held:
        out.print(
            safe_text(
                f"{preview.held} of them stay dead: a live job holds their dedup key "
                "(replaying would run the same work twice)"
            )
        )
    if yes:
        return preview
    if not sys.stdin.isatty():
        click.echo(
            f"error: not asking without a terminal: pass --yes to {verb.lower()} these "
            f"{count} dead job{plural}",
            err=True,
        )
        sys.exit(2)
    click.confirm(f"{verb} these {count} dead job{plural}?", abort=True, err=True)
    return preview
