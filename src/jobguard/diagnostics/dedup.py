"""One business operation enqueued as many jobs: split operations and unstable dedup keys.

A dedup key keeps a second job out only if the producer builds the same key for the same
business action. A key with a timestamp or a fresh id in it differs every time, so one action
becomes many jobs. Two signs of it:

* **split operations**: several jobs carry one operation key. The operation record absorbed
  them (the later ones were acked as already processed), but the producer enqueued one action
  several times;
* **unstable dedup keys**: jobs of one task whose dedup keys differ only in a *volatile* part:
  a timestamp (epoch seconds or milliseconds, or an ISO date with a time), a UUID or a long hex
  id (:data:`VOLATILE`). Without an operation key to absorb them, each of those jobs ran. A
  calendar date alone (``report:2026-12-01``) is a period, not volatile, and a schedule's tick
  key (``schedule:NAME@TICK``, one job per tick by design) is jobguard's own, not a producer's.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from jobguard.core.schedules import is_tick_key
from jobguard.diagnostics.findings import Finding, Keys, Kind, Severity, ids
from jobguard.models import Job

VOLATILE = re.compile(
    r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"  # UUID
    r"|\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?"  # ISO time
    r"|(?<![0-9A-Za-z])(?=[0-9a-fA-F]*[a-fA-F])(?=[0-9a-fA-F]*\d)[0-9a-fA-F]{16,}"  # hex id
    r"|\d{10,}(?:\.\d+)?"  # epoch seconds, milliseconds or nanoseconds
)
PLACEHOLDER = "<volatile>"
EXAMPLES = 3


@dataclass(frozen=True, slots=True)
class SplitOperation:
    """One operation key carried by several jobs."""

    operation_key: str
    task: str
    job_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class UnstableKey:
    """Dedup keys of one task that name one action but differ every time."""

    task: str
    pattern: str
    """The key with its volatile part replaced by ``<volatile>``."""
    dedup_keys: tuple[str, ...]
    """Up to :data:`EXAMPLES` of the keys, in the order their jobs were enqueued."""
    job_ids: tuple[int, ...]
    absorbed: bool
    """Every one of those jobs has an operation key (the extra jobs were not run twice)."""


def split_operations(jobs: Iterable[Job]) -> list[SplitOperation]:
    """Operation keys carried by more than one job, in key order."""
    by_key: dict[str, list[Job]] = defaultdict(list)
    for job in jobs:
        if job.operation_key is not None:
            by_key[job.operation_key].append(job)
    return [
        SplitOperation(key, members[0].task, tuple(sorted(j.id for j in members)))
        for key, members in sorted(by_key.items())
        if len(members) > 1
    ]


def unstable_keys(jobs: Iterable[Job]) -> list[UnstableKey]:
    """Groups of jobs of one task whose dedup keys differ only in a volatile part."""
    keyed = sorted(
        (j for j in jobs if j.dedup_key is not None and not is_tick_key(j.dedup_key, j.task)),
        key=lambda j: j.id,
    )
    groups: dict[tuple[str, str], dict[int, Job]] = defaultdict(dict)
    for job in keyed:
        assert job.dedup_key is not None
        masked = VOLATILE.sub(PLACEHOLDER, job.dedup_key)
        if masked != job.dedup_key:
            groups[(job.task, masked)][job.id] = job
    found: list[UnstableKey] = []
    for (task, pattern), members in sorted(groups.items()):
        keys = list(dict.fromkeys(j.dedup_key for j in members.values() if j.dedup_key))
        if len(keys) < 2:
            continue
        found.append(
            UnstableKey(
                task=task,
                pattern=pattern,
                dedup_keys=tuple(keys[:EXAMPLES]),
                job_ids=tuple(sorted(members)),
                absorbed=all(j.operation_key is not None for j in members.values()),
            )
        )
    return found


def dedup_findings(
    splits: Iterable[SplitOperation], unstable: Iterable[UnstableKey]
) -> list[Finding]:
    """Warnings for split operations; unstable keys are a problem unless operation keys absorbed
    the extra jobs."""
    found = [
        Finding(
            kind=Kind.SPLIT_OPERATION,
            severity=Severity.WARNING,
            task=s.task,
            summary=(
                f"operation {s.operation_key}: enqueued as {len(s.job_ids)} jobs ({ids(s.job_ids)})"
            ),
            advice=(
                "its operation key absorbed the extra jobs, but the producer enqueues one "
                "business action several times: give it a dedup_key built from the action "
                "only (no timestamp, no fresh id)"
            ),
            keys=Keys(job_ids=s.job_ids, operation_keys=(s.operation_key,)),
            numbers={"jobs": len(s.job_ids)},
        )
        for s in splits
    ]
    for u in unstable:
        absorbed = (
            "operation keys absorbed the extra jobs"
            if u.absorbed
            else "without an operation key each of those jobs ran its effects"
        )
        found.append(
            Finding(
                kind=Kind.UNSTABLE_DEDUP_KEY,
                severity=Severity.WARNING if u.absorbed else Severity.PROBLEM,
                task=u.task,
                summary=(
                    f"task {u.task}: unstable dedup key {u.pattern!r}, {len(u.job_ids)} jobs "
                    f"({ids(u.job_ids)}) with keys that differ only in a volatile part, e.g. "
                    f"{', '.join(repr(k) for k in u.dedup_keys)}; {absorbed}"
                ),
                advice=(
                    "build the dedup key from what identifies the business action (an order "
                    "id), never from the time of the request or a fresh id"
                ),
                keys=Keys(job_ids=u.job_ids, dedup_keys=u.dedup_keys),
                numbers={"jobs": len(u.job_ids)},
            )
        )
    return found
