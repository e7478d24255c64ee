"""G10.4, second half: errors that come back again and again, and poison candidates.

Failed deliveries (``retry`` and ``dead`` with an error class) are grouped by task and error
*signature*: the error class and the code locations of its stored traceback, as the worker's own
poison detection does (G8.2), so ids and timestamps in messages do not split one bug into many.
Without a traceback (errors raised before the handler ran) the signature is the class and the
message's first :data:`MESSAGE_PREFIX` characters with digits masked.

A group in which one job failed :data:`POISON_REPEATS` times or more is a poison candidate: the
same job, the same stack trace, again and again; unless the signature struck many jobs at once,
which is an outage (:mod:`.outages`), not poison.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter, defaultdict
from collections.abc import Collection, Iterable
from dataclasses import dataclass

from jobguard.diagnostics.findings import Finding, Keys, Kind, Severity, ids
from jobguard.models import Attempt, Outcome

FAILED = frozenset({Outcome.RETRY, Outcome.DEAD})
MESSAGE_PREFIX = 60
POISON_REPEATS = 3
EXAMPLE_JOBS = 5
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<name>.+)$', re.M)
_DIGITS = re.compile(r"\d+")


@dataclass(frozen=True, slots=True)
class ErrorGroup:
    """One error signature of one task, with how often and where it struck."""

    task: str
    error_type: str
    signature: str
    where: str | None
    """The innermost frame of the traceback, ``file:line in function`` (``None``: no traceback)."""
    message: str
    """The message of the latest occurrence (shortened)."""
    attempts: int
    jobs: int
    job_ids: tuple[int, ...]
    """Up to :data:`EXAMPLE_JOBS` example job ids, the most affected first."""
    max_per_job: int
    """The most times any one job failed with this signature."""
    dead: int
    """How many of these failures buried their job."""
    poison: bool
    poison_job_ids: tuple[int, ...]
    """The jobs that failed this way :data:`POISON_REPEATS` times or more, in numeric order."""
    outage: bool
    """The signature also struck many jobs at once (an outage): then it is not poison."""
    last_seen_at: float


def signature_of(
    error_type: str, message: str | None, traceback: str | None
) -> tuple[str, str | None]:
    """The signature of one failure and its innermost frame (``None`` without a traceback)."""
    frames = _FRAME.findall(traceback or "")
    if frames:
        basis = [error_type, *(f"{file}:{name}:{line}" for file, line, name in frames)]
        file, line, name = frames[-1]
        where: str | None = f"{file.rsplit('/', 1)[-1]}:{line} in {name.strip()}"
    else:
        basis = [error_type, _DIGITS.sub("#", message or "")[:MESSAGE_PREFIX]]
        where = None
    digest = hashlib.blake2b("\n".join(basis).encode(), digest_size=8).hexdigest()
    return digest, where


def failures_by_signature(
    attempts: Iterable[Attempt],
) -> tuple[dict[tuple[str, str], list[Attempt]], dict[tuple[str, str], str | None]]:
    """Failed deliveries grouped by ``(task, signature)``, oldest first, and where each struck."""
    groups: dict[tuple[str, str], list[Attempt]] = defaultdict(list)
    wheres: dict[tuple[str, str], str | None] = {}
    for attempt in sorted(attempts, key=lambda a: (a.started_at, a.id)):
        if attempt.outcome not in FAILED or attempt.error_type is None:
            continue
        signature, where = signature_of(
            attempt.error_type, attempt.error_message, attempt.traceback
        )
        groups[(attempt.task, signature)].append(attempt)
        wheres[(attempt.task, signature)] = where
    return groups, wheres


def repeated_errors(
    attempts: Iterable[Attempt],
    *,
    top: int = 5,
    min_count: int = 2,
    poison_repeats: int = POISON_REPEATS,
    outages: Collection[tuple[str, str]] = (),
) -> list[ErrorGroup]:
    """The ``top`` error signatures seen at least ``min_count`` times, most frequent first.

    Args:
        attempts: The attempt log.
        top: How many groups to return.
        min_count: A signature seen fewer times is not "repeating".
        poison_repeats: One job failing this often with one signature makes it a poison candidate.
        outages: ``(task, signature)`` pairs that struck many jobs at once: never poison.
    """
    groups, wheres = failures_by_signature(attempts)
    found: list[ErrorGroup] = []
    for (task, signature), members in groups.items():
        if len(members) < min_count:
            continue
        per_job = Counter(member.job_id for member in members)
        latest = members[-1]
        most = max(per_job.values())
        outage = (task, signature) in outages
        found.append(
            ErrorGroup(
                task=task,
                error_type=latest.error_type or "",
                signature=signature,
                where=wheres[(task, signature)],
                message=(latest.error_message or "")[:120],
                attempts=len(members),
                jobs=len(per_job),
                job_ids=tuple(
                    job_id for job_id, _ in sorted(per_job.items(), key=lambda kv: (-kv[1], kv[0]))
                )[:EXAMPLE_JOBS],
                max_per_job=most,
                dead=sum(member.outcome == Outcome.DEAD for member in members),
                poison=most >= poison_repeats and not outage,
                poison_job_ids=tuple(
                    sorted(job_id for job_id, count in per_job.items() if count >= poison_repeats)
                ),
                outage=outage,
                last_seen_at=latest.started_at,
            )
        )
    found.sort(key=lambda g: (-g.attempts, -g.jobs, -g.last_seen_at, g.task))
    return found[:top]


def poison_findings(groups: Iterable[ErrorGroup]) -> list[Finding]:
    """A warning per poison candidate, naming the jobs that failed the same way again and again."""
    return [
        Finding(
            kind=Kind.POISON,
            severity=Severity.WARNING,
            task=group.task,
            summary=(
                f"task {group.task}: poison candidate {group.error_type} at {group.where or '?'}: "
                f"job(s) {ids(group.poison_job_ids)} failed the same way {group.max_per_job} "
                "times"
            ),
            advice=(
                "a job that always fails is a bug or bad data, not bad luck: fix the cause, then "
                "replay it (jobguard dlq replay ID) or purge it"
            ),
            keys=Keys(job_ids=group.poison_job_ids),
            numbers={
                "attempts": group.attempts,
                "jobs": group.jobs,
                "max_per_job": group.max_per_job,
                "dead": group.dead,
            },
        )
        for group in groups
        if group.poison
    ]
