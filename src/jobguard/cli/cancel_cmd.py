"""``jobguard cancel ID``: cancel a queued, scheduled or running job (#17)."""

from __future__ import annotations

import click

from jobguard.cli.jobs_cmd import JOB_ID, console, safe_text
from jobguard.cli.queue_cmd import cli_actor
from jobguard.cli.state import CliState
from jobguard.models import JobStatus


@click.command()
@click.argument("job_id", type=JOB_ID, metavar="ID")
@click.pass_obj
def cancel(state: CliState, job_id: int) -> None:
    """Cancel job ID, audited under the CLI user.

    A queued or scheduled job never runs: it goes to the dead letter queue as cancelled (replay
    it to run it after all). A running one is told to stop (its worker reads the cancel with
    its next renewal) and is buried as cancelled, not retried. An unknown or finished job
    exits 1 and changes nothing.
    """
    job = state.inspecting_app().cancel(job_id, actor=cli_actor())
    if job.status == JobStatus.DEAD:
        console().print(safe_text(f"job {job.id} cancelled: it will not run (dead, cancelled)"))
    else:
        console().print(
            safe_text(
                f"job {job.id} is running: its worker was asked to stop it (it is buried as "
                "cancelled when its run ends)"
            )
        )
