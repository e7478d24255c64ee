"""A stall is not a slow handler: a worker process that stood still past its lease.

When a whole worker process stands still (SIGSTOP, a paused or migrated VM, swapping, a long
GC pause), its heartbeat cannot renew the leases it holds; they expire, the jobs are delivered
again, and when the process resumes its writes are refused. Its run looks long, but the
handler was not slow: lengthening the timeout only helps stalls shorter than it. The worker
tells the two apart on its own monotonic clock (its heartbeat's wait overslept by a whole beat
or more) and says so in the refusal it records (:func:`jobguard.core.messages.stood_still`);
those runs are reported here, one line per worker, and left out of the duration advice.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from jobguard.core.messages import stalled_s_of
from jobguard.diagnostics.findings import Finding, Keys, Kind, Severity, ids, seconds
from jobguard.models import Attempt, Outcome

REFUSED = frozenset({Outcome.LEASE_REFUSED, Outcome.FENCE_REFUSED})


@dataclass(frozen=True, slots=True)
class Stall:
    """The deliveries one worker lost because the whole process stood still."""

    worker_id: str
    tasks: tuple[str, ...]
    stalled_s: float
    """The longest time the worker stood still."""
    job_ids: tuple[int, ...]
    attempt_ids: tuple[int, ...]


def stalled_s(attempt: Attempt) -> float | None:
    """How long the worker stood still under this refused delivery (``None``: no stall)."""
    if attempt.outcome not in REFUSED:
        return None
    return stalled_s_of(attempt.error_message)


def find_stalls(attempts: Iterable[Attempt]) -> list[Stall]:
    """Refused deliveries lost to a stall of their worker, one record per worker."""
    by_worker: dict[str, list[tuple[Attempt, float]]] = defaultdict(list)
    for attempt in attempts:
        stood = stalled_s(attempt)
        if stood is not None:
            by_worker[attempt.worker_id].append((attempt, stood))
    return [
        Stall(
            worker_id=worker,
            tasks=tuple(sorted({a.task for a, _ in found})),
            stalled_s=max(stood for _, stood in found),
            job_ids=tuple(sorted({a.job_id for a, _ in found})),
            attempt_ids=tuple(sorted(a.id for a, _ in found)),
        )
        for worker, found in sorted(by_worker.items())
    ]


def stall_findings(stalls: Iterable[Stall]) -> list[Finding]:
    """A warning per stalled worker: what stood still, for how long, and what it cost."""
    return [
        Finding(
            kind=Kind.STALL,
            severity=Severity.WARNING,
            task=stall.tasks[0] if len(stall.tasks) == 1 else None,
            summary=(
                f"worker {stall.worker_id}: the process stood still for "
                f"{seconds(stall.stalled_s)} (its heartbeat did not run) while it held job "
                f"{ids(stall.job_ids)}: the leases ran out, the jobs were delivered again, and "
                "its late writes were refused"
            ),
            advice=(
                "a stall, not a slow handler: a longer visibility_timeout_s helps only with "
                "stalls shorter than it; look at what froze the process at that time (SIGSTOP, "
                "a paused or migrated VM, swapping, a long GC pause)"
            ),
            keys=Keys(job_ids=stall.job_ids, attempt_ids=stall.attempt_ids),
            numbers={"stalled_s": round(stall.stalled_s, 3), "deliveries": len(stall.attempt_ids)},
        )
        for stall in stalls
    ]
