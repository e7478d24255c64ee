"""One business operation enqueued as many jobs: split operations and unstable dedup keys.

A dedup key keeps a second job out only if the producer builds the same key for the same
business action. A key with a timestamp or a fresh id in it differs every time, so one action
becomes many jobs. Two signs of it:

* **split operations**: several jobs carry one operation key. The operation record absorbed
  them (the later ones were acked as already processed), but the producer enqueued one action
  several times. When every extra job came after an earlier one had completed (a webhook
  delivered again), they are **late duplicates**, absorbed by design; what the advice names
  depends on what the jobs had: one dedup key, released at completion (a dedup window was
  missing), none, or keys that differ. Findings are one line per task and case, not one per
  operation;
* **unstable dedup keys**: jobs of one task whose dedup keys differ only in a *volatile* part:
  a timestamp (epoch seconds or milliseconds, or an ISO date with a time), a UUID or a long hex
  id (:data:`VOLATILE`). Without an operation key to absorb them, each of those jobs ran. A
  calendar date alone (``report:2026-12-01``) is a period, not volatile, and a schedule's tick
  key (``schedule:NAME@TICK``, one job per tick by design) is jobguard's own, not a producer's.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from jobguard.core.schedules import is_tick_key
from jobguard.diagnostics.findings import Finding, Keys, Kind, Severity, ids, seconds
from jobguard.models import Job, JobStatus

VOLATILE = re.compile(
    r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"  # UUID
    r"|\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?"  # ISO time
    r"|(?<![0-9A-Za-z])(?=[0-9a-fA-F]*[a-fA-F])(?=[0-9a-fA-F]*\d)[0-9a-fA-F]{16,}"  # hex id
    r"|\d{10,}(?:\.\d+)?"  # epoch seconds, milliseconds or nanoseconds
)
PLACEHOLDER = "<volatile>"
EXAMPLES = 3


class DedupKeys(StrEnum):
    """What dedup keys the jobs of one split operation had."""

    SAME = "same"
    NONE = "none"
    DIFFER = "differ"


@dataclass(frozen=True, slots=True)
class SplitOperation:
    """One operation key carried by several jobs."""

    operation_key: str
    task: str
    job_ids: tuple[int, ...]
    late: bool = False
    """Every job after the first was enqueued after an earlier one had completed."""
    dedup_keys: DedupKeys = DedupKeys.NONE
    latest_after_s: float = 0.0
    """For late duplicates: the longest time from a completion to the next job's enqueue."""


def _split(key: str, members: list[Job]) -> SplitOperation:
    members = sorted(members, key=lambda j: j.id)
    gaps: list[float] = []
    for number, job in enumerate(members[1:], start=1):
        done = [
            e.finished_at
            for e in members[:number]
            if e.status == JobStatus.COMPLETED
            and e.finished_at is not None
            and e.finished_at <= job.created_at
        ]
        if done:
            gaps.append(job.created_at - max(done))
    keys = {j.dedup_key for j in members}
    kind = (
        DedupKeys.NONE
        if keys == {None}
        else (DedupKeys.SAME if len(keys) == 1 else DedupKeys.DIFFER)
    )
    late = len(gaps) == len(members) - 1
    return SplitOperation(
        key,
        members[0].task,
        tuple(j.id for j in members),
        late=late,
        dedup_keys=kind,
        latest_after_s=max(gaps) if late else 0.0,
    )


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
    return [_split(key, members) for key, members in sorted(by_key.items()) if len(members) > 1]


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


_LATE_ADVICE = {
    DedupKeys.SAME: "nothing ran twice; their dedup key was released when the first job "
    "completed: to keep such redeliveries out of the queue, hold it longer with "
    "dedup_window_s={window:g} or more",
    DedupKeys.NONE: "nothing ran twice; to keep such redeliveries out of the queue, give them a "
    "dedup_key built from the action, held with dedup_window_s={window:g} or more",
    DedupKeys.DIFFER: "nothing ran twice; their dedup keys differ, so none held: build the "
    "dedup key from the action only (no timestamp, no fresh id), held with "
    "dedup_window_s={window:g} or more",
}
_SPLIT_ADVICE = {
    DedupKeys.SAME: "the operation key absorbed the extra jobs",
    DedupKeys.NONE: "the operation key absorbed the extra jobs, but the producer enqueues one "
    "business action several times: give it a dedup_key built from the action only",
    DedupKeys.DIFFER: "the operation key absorbed the extra jobs, but their dedup keys differ, "
    "so none held: build the dedup key from the action only (no timestamp, no fresh id)",
}


def _split_finding(task: str, late: bool, keys: DedupKeys, group: list[SplitOperation]) -> Finding:
    every = tuple(sorted(job_id for s in group for job_id in s.job_ids))
    extra = tuple(sorted(job_id for s in group for job_id in s.job_ids[1:]))
    operations = tuple(s.operation_key for s in group)
    numbers: dict[str, float] = {
        "operations": len(group),
        "jobs": len(every),
        "extra_jobs": len(extra),
    }
    if late:
        after_s = max(s.latest_after_s for s in group)
        numbers["latest_after_s"] = round(after_s, 3)
        summary = (
            f"task {task}: {len(group)} operations enqueued again after they had completed "
            f"({len(extra)} late duplicates, jobs {ids(extra)}, the latest "
            f"{seconds(after_s)} after its completion), each acked by its operation record "
            "without running again"
        )
        advice = _LATE_ADVICE[keys].format(window=math.floor(after_s) + 1)
    else:
        summary = (
            f"task {task}: {len(group)} operations enqueued as several jobs while the first was "
            f"still pending (extra jobs {ids(extra)}; e.g. operation {operations[0]})"
        )
        advice = _SPLIT_ADVICE[keys]
    return Finding(
        kind=Kind.LATE_DUPLICATE if late else Kind.SPLIT_OPERATION,
        severity=Severity.HINT if late else Severity.WARNING,
        task=task,
        summary=summary,
        advice=advice,
        keys=Keys(job_ids=every, operation_keys=operations),
        numbers=numbers,
    )


def dedup_findings(
    splits: Iterable[SplitOperation], unstable: Iterable[UnstableKey]
) -> list[Finding]:
    """One line per task and case for split operations (a hint for late duplicates, else a
    warning); unstable keys are a problem unless operation keys absorbed the extra jobs."""
    groups: dict[tuple[str, bool, DedupKeys], list[SplitOperation]] = defaultdict(list)
    for split in splits:
        groups[(split.task, split.late, split.dedup_keys)].append(split)
    found = [
        _split_finding(task, late, keys, group)
        for (task, late, keys), group in sorted(groups.items())
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
