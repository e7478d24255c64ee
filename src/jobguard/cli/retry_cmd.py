"""``jobguard retry-now ID``: run a job waiting on its backoff as soon as a worker is free (#17)."""

from __future__ import annotations

import click

from jobguard.cli.dlq_bulk import actor
from jobguard.cli.jobs_cmd import JOB_ID, console, safe_text
from jobguard.cli.state import CliState


@click.command(name="retry-now")
@click.argument("job_id", type=JOB_ID, metavar="ID")
@click.pass_obj
def retry_now(state: CliState, job_id: int) -> None:
    """Make queued job ID, waiting for its run time (a retry's backoff, a delay), due now.

    Its attempts and limits stay as they are; the action is audited. A running, completed or
    dead job is refused and left as it is (replay a dead one with `dlq replay ID`).
    """
    job = state.inspecting_app().retry_now(job_id, actor=actor())
    console().print(
        safe_text(
            f"job {job.id} is due now: {job.task} on queue {job.queue}, "
            f"attempt {job.attempts}/{job.max_attempts} so far"
        )
    )
