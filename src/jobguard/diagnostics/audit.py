"""G10.5: did every important effect leave its trace?

Whether a task *should* record an external reference (``ctx.set_external_ref``) is not written
anywhere, so the audit counts rather than judges: operations completed, with and without one,
per task; a task where some have one and some do not is worth a look, and examples are listed.
Two things are always wrong and listed by id: a completed job with an operation key but no
completed operation record (G4.3 broken), and an operation stuck in ``processing`` with
no queued or running job left to finish it.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from jobguard.models import Job, JobStatus, Operation, OperationStatus

EXAMPLES = 5
_NUMBERS = re.compile(r"(\d+)")


@dataclass(frozen=True, slots=True)
class TaskTraces:
    """External references left by one task's completed operations."""

    task: str
    completed: int
    with_external_ref: int
    without_external_ref: int
    examples_without: tuple[str, ...]
    """The most recent operation keys without a reference, in numeric order; listed when others
    of the task have one."""


@dataclass(frozen=True, slots=True)
class Audit:
    """The trace every completed operation left (counts), and what is missing (ids)."""

    completed_jobs_with_key: int
    operations_completed: int
    with_external_ref: int
    without_external_ref: int
    by_task: tuple[TaskTraces, ...]
    missing_records: tuple[int, ...]
    """Completed jobs with an operation key but no completed operation record (should be none)."""
    stuck_processing: tuple[str, ...]
    """Operations in ``processing`` that no queued or running job will finish."""


def natural(text: str) -> tuple[tuple[int, int | str], ...]:
    """Sort key that orders the numbers inside strings by value: ``op:2`` before ``op:10``."""
    return tuple(
        (0, int(part)) if part.isdigit() else (1, part) for part in _NUMBERS.split(text) if part
    )


def _task_traces(
    completed: Mapping[str, Operation], task_of: Mapping[str, str]
) -> tuple[TaskTraces, ...]:
    by_task: dict[str, list[Operation]] = defaultdict(list)
    for key, operation in completed.items():
        by_task[task_of.get(key, "?")].append(operation)
    found = []
    for task in sorted(by_task):
        operations = by_task[task]
        without = [op for op in operations if op.external_ref is None]
        recent = sorted(without, key=lambda op: (op.completed_at or op.updated_at, op.key))
        examples = sorted((op.key for op in recent[-EXAMPLES:]), key=natural)
        found.append(
            TaskTraces(
                task=task,
                completed=len(operations),
                with_external_ref=len(operations) - len(without),
                without_external_ref=len(without),
                examples_without=tuple(examples) if 0 < len(without) < len(operations) else (),
            )
        )
    return tuple(found)


def audit(
    jobs: Iterable[Job],
    every_job: Iterable[Job],
    operations: Mapping[str, Operation | None],
    now: float,
) -> Audit:
    """Check the operation records of the jobs in scope.

    Args:
        jobs: The jobs to audit (task and window applied).
        every_job: Every job read, whatever its task or age: a ``processing`` operation is
            stuck only if none of these is queued or running with its key.
        operations: Operation records by key (``None``: no record).
        now: The store clock when the jobs were read; operations claimed later are not judged.
    """
    every_job = list(every_job)
    task_of = {job.operation_key: job.task for job in every_job if job.operation_key}
    missing: list[int] = []
    completed_with_key = 0
    for job in jobs:
        if job.operation_key is None:
            continue
        if job.status == JobStatus.COMPLETED:
            completed_with_key += 1
            record = operations.get(job.operation_key)
            if record is None or record.status != OperationStatus.COMPLETED:
                missing.append(job.id)
    live_keys = {
        job.operation_key
        for job in every_job
        if job.status in (JobStatus.QUEUED, JobStatus.RUNNING) and job.operation_key
    }
    completed = {
        key: op
        for key, op in operations.items()
        if op is not None and op.status == OperationStatus.COMPLETED
    }
    stuck = sorted(
        key
        for key, op in operations.items()
        if op is not None
        and op.status == OperationStatus.PROCESSING
        and op.updated_at <= now
        and key not in live_keys
    )
    with_ref = sum(op.external_ref is not None for op in completed.values())
    return Audit(
        completed_jobs_with_key=completed_with_key,
        operations_completed=len(completed),
        with_external_ref=with_ref,
        without_external_ref=len(completed) - with_ref,
        by_task=_task_traces(completed, task_of),
        missing_records=tuple(sorted(missing)),
        stuck_processing=tuple(stuck),
    )
