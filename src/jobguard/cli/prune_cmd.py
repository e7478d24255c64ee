"""``jobguard prune``: retention for completed jobs."""

from __future__ import annotations

import click

from jobguard.cli.jobs_cmd import SECONDS
from jobguard.cli.state import CliState


@click.command()
@click.option(
    "--older-than-s",
    type=SECONDS,
    required=True,
    help="Delete completed jobs that finished more than this many seconds ago.",
)
@click.pass_obj
def prune(state: CliState, older_than_s: float) -> None:
    """Delete old completed jobs and their attempt rows; keep operation records and steps.

    Jobs whose dedup window is still open are kept, and the operation records stay, so a late
    duplicate is still acked as already processed (G4.3, G6).
    """
    pruned = state.inspecting_app().prune(older_than_s)
    click.echo(f"pruned {pruned} completed job{'s' if pruned != 1 else ''}")
