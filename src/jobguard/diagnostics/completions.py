"""The audit in the summary: completions that did less than the task usually does, and the audit's
findings (missing external references, missing operation records, stuck operations).

A completed delivery ran ``steps_run`` steps and skipped ``steps_skipped`` already recorded ones;
their sum is how many steps the handler went through. A task's *usual* count is the most common
sum among its completed deliveries, once it has :data:`MIN_COMPLETIONS`; a completion that went
through fewer steps returned early, and whatever it skipped did not happen.

The most common count is not always the full run: while a dependency is down, a handler that
swallows its error and returns can make most completions short. So the *fullest* count that at
least :data:`MIN_COMPLETIONS` completions, and :data:`MIN_FULL_SHARE` of them, went through is
the usual one when it is higher, and a completion below it is short when its operation recorded
only steps that every one of those full runs recorded too (it stopped partway through their
work, rather than taking another branch).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from jobguard.diagnostics.audit import Audit
from jobguard.diagnostics.findings import Finding, Keys, Kind, Severity, ids
from jobguard.models import Attempt, Operation, Outcome

MIN_COMPLETIONS = 3
MIN_FULL_SHARE = 0.25


@dataclass(frozen=True, slots=True)
class ShortCompletions:
    """Completed deliveries of one task that went through fewer steps than usual."""

    task: str
    usual_steps: int
    completions: int
    short: int
    job_ids: tuple[int, ...]
    attempt_ids: tuple[int, ...]
    fewest_steps: int


def _went_through(attempt: Attempt) -> int:
    return attempt.steps_run + attempt.steps_skipped


def _names(attempt: Attempt, operations: Mapping[str, Operation | None]) -> frozenset[str] | None:
    record = operations.get(attempt.operation_key or "")
    return None if record is None else frozenset(record.steps)


def _usual(
    completed: list[Attempt], operations: Mapping[str, Operation | None]
) -> tuple[int, list[Attempt]]:
    """The usual step count of one task's completions, and the completions short of it."""
    counts = Counter(_went_through(a) for a in completed)
    usual = max(counts, key=lambda n: (counts[n], n))
    enough = max(MIN_COMPLETIONS, MIN_FULL_SHARE * len(completed))
    fullest = max(n for n in counts if counts[n] >= enough or n == usual)
    if fullest > usual:
        full_names = [_names(a, operations) for a in completed if _went_through(a) == fullest]
        if all(names is not None for names in full_names):
            common = frozenset.intersection(*(n for n in full_names if n is not None))
            short = [
                a
                for a in completed
                if _went_through(a) < fullest
                and (names := _names(a, operations)) is not None
                and names < common
            ]
            if short:
                return fullest, short
    short = [a for a in completed if _went_through(a) < usual]
    if len(short) * 2 >= len(completed):
        return usual, []
    return usual, short


def short_completions(
    attempts: Iterable[Attempt],
    operations: Mapping[str, Operation | None] | None = None,
    *,
    min_completions: int = MIN_COMPLETIONS,
) -> list[ShortCompletions]:
    """Per task, the completions with fewer steps than its usual count, by task name.

    Args:
        attempts: The attempt log.
        operations: Operation records by key, whose step names tell a completion that stopped
            partway from one that took another branch (without them only the most common count
            is judged).
        min_completions: A task with fewer completions is not judged.
    """
    steps: dict[str, list[Attempt]] = defaultdict(list)
    for attempt in attempts:
        if attempt.outcome == Outcome.COMPLETED:
            steps[attempt.task].append(attempt)
    found: list[ShortCompletions] = []
    for task in sorted(steps):
        completed = steps[task]
        if len(completed) < min_completions:
            continue
        usual, short = _usual(completed, operations or {})
        if not short:
            continue
        found.append(
            ShortCompletions(
                task=task,
                usual_steps=usual,
                completions=len(completed),
                short=len(short),
                job_ids=tuple(sorted({a.job_id for a in short})),
                attempt_ids=tuple(sorted(a.id for a in short)),
                fewest_steps=min(_went_through(a) for a in short),
            )
        )
    return found


def completion_findings(
    shorts: Iterable[ShortCompletions], audit: Audit, crashed_operations: Collection[str] = ()
) -> list[Finding]:
    """Warnings for short completions and for what the audit found missing.

    Args:
        shorts: From :func:`short_completions`.
        audit: The audit of the operation records.
        crashed_operations: Operation keys of crash-loop culprits: they are stuck because of
            the crash loop, which is reported on its own.
    """
    found = [
        Finding(
            kind=Kind.SHORT_COMPLETION,
            severity=Severity.WARNING,
            task=s.task,
            summary=(
                f"task {s.task}: {s.short} of {s.completions} completions went through fewer "
                f"steps than the usual {s.usual_steps} (as few as {s.fewest_steps}): jobs "
                f"{ids(s.job_ids)}"
            ),
            advice=(
                "the handler returned early on those jobs, so the steps it skipped never "
                "happened: check the condition that ends it early"
            ),
            keys=Keys(job_ids=s.job_ids, attempt_ids=s.attempt_ids),
            numbers={
                "completions": s.completions,
                "short": s.short,
                "usual_steps": s.usual_steps,
                "fewest_steps": s.fewest_steps,
            },
        )
        for s in shorts
    ]
    found.extend(
        Finding(
            kind=Kind.MISSING_EXTERNAL_REF,
            severity=Severity.WARNING,
            task=t.task,
            summary=(
                f"task {t.task}: {t.without_external_ref} of {t.completed} operations completed "
                f"without an external reference, where most have one (e.g. "
                f"{', '.join(t.examples_without)})"
            ),
            advice=(
                "those completions may not have done the effect whose reference the others "
                "record (ctx.set_external_ref): look at their attempts"
            ),
            keys=Keys(operation_keys=t.examples_without),
            numbers={
                "completed": t.completed,
                "with_external_ref": t.with_external_ref,
                "without_external_ref": t.without_external_ref,
            },
        )
        for t in audit.by_task
        if 0 < t.without_external_ref < t.with_external_ref
    )
    found.extend(
        Finding(
            kind=Kind.MISSING_RECORD,
            severity=Severity.WARNING,
            task=None,
            summary=f"job {job_id}: completed with an operation key but no completed operation "
            "record",
            advice="the job was acked without its operation record: report this as a bug",
            keys=Keys(job_ids=(job_id,)),
        )
        for job_id in audit.missing_records
    )
    found.extend(
        Finding(
            kind=Kind.STUCK_PROCESSING,
            severity=Severity.WARNING,
            task=None,
            summary=f"operation {key}: stuck in processing with no queued or running job",
            advice="its last delivery's worker died; jobguard dlq replay runs it again",
            keys=Keys(operation_keys=(key,)),
        )
        for key in audit.stuck_processing
        if key not in crashed_operations
    )
    return found
