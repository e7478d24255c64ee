"""The whole diagnosis: every check over one snapshot, and the findings they add up to."""

from __future__ import annotations

from dataclasses import dataclass

from jobguard.diagnostics.audit import Audit, audit
from jobguard.diagnostics.completions import (
    ShortCompletions,
    completion_findings,
    short_completions,
)
from jobguard.diagnostics.crashes import CrashLoop, crash_findings, find_crash_loops
from jobguard.diagnostics.deaths import WorkerDeaths, death_findings, worker_deaths
from jobguard.diagnostics.dedup import (
    SplitOperation,
    UnstableKey,
    dedup_findings,
    split_operations,
    unstable_keys,
)
from jobguard.diagnostics.durations import TaskDurations, task_durations, timeout_findings
from jobguard.diagnostics.findings import Finding, Severity
from jobguard.diagnostics.outages import Outage, find_outages, outage_findings
from jobguard.diagnostics.overlaps import Overlap, find_overlaps, overlap_findings
from jobguard.diagnostics.poison import ErrorGroup, poison_findings, repeated_errors
from jobguard.diagnostics.resources import (
    ResourceOverlap,
    ResourceUse,
    SlotOverrun,
    SlotUse,
    fence_refusals,
    find_resource_overlaps,
    find_slot_overruns,
    resource_findings,
    resource_use,
    slot_use,
)
from jobguard.diagnostics.retries import TaskRetries, retry_rates, spike_findings
from jobguard.diagnostics.snapshot import Snapshot
from jobguard.diagnostics.stalls import Stall, find_stalls, stall_findings

SEVERITY_ORDER = {Severity.PROBLEM: 0, Severity.WARNING: 1, Severity.HINT: 2}


@dataclass(frozen=True, slots=True)
class Diagnosis:
    """What ``jobguard doctor`` reports (G10.2-G10.5).

    Attributes:
        now: The store clock when the data was read.
        task: Only this task was looked at (``None``: every task).
        since: Only data active at or after this store time (``None``: all read).
        attempts: How many attempts were looked at.
        findings: Every cause found, problems first: kind, severity, task, keys and numbers.
        overlaps: G10.2, deliveries of one operation (or job) that ran at the same time.
        resource_overlaps: Deliveries of different operations that ran at once under one
            resource lock.
        resources: Per resource key and task, lock-busy deferrals, wait against run time and
            the task that holds the lock longest.
        slots: Per concurrency key and task, slot-busy deferrals, wait against run time and
            the task that holds a slot longest.
        slot_overruns: More operations (or jobs) running at once under one concurrency key
            than its limit.
        durations: G10.3, per task, the duration distribution against its timeouts, with advice.
        retries: G10.4, per task, retry and failure rates and spikes.
        errors: G10.4, the errors that repeat most, with poison candidates.
        outages: Many jobs of a task failing the same way within a short window.
        crash_loops: Worker crashes with the same job present at each.
        worker_deaths: The worker processes that died, what they took down and what recovered
            (``None``: none died).
        stalls: Workers whose whole process stood still past the leases it held.
        split_operations: Operation keys carried by several jobs.
        unstable_dedup_keys: Dedup keys that differ only in a timestamp or a fresh id.
        short_completions: Completions that went through fewer steps than the task usually does.
        audit: G10.5, the traces completed operations left.
    """

    now: float
    task: str | None
    since: float | None
    attempts: int
    findings: tuple[Finding, ...]
    overlaps: tuple[Overlap, ...]
    resource_overlaps: tuple[ResourceOverlap, ...]
    resources: tuple[ResourceUse, ...]
    slots: tuple[SlotUse, ...]
    slot_overruns: tuple[SlotOverrun, ...]
    durations: tuple[TaskDurations, ...]
    retries: tuple[TaskRetries, ...]
    errors: tuple[ErrorGroup, ...]
    outages: tuple[Outage, ...]
    crash_loops: tuple[CrashLoop, ...]
    worker_deaths: WorkerDeaths | None
    stalls: tuple[Stall, ...]
    split_operations: tuple[SplitOperation, ...]
    unstable_dedup_keys: tuple[UnstableKey, ...]
    short_completions: tuple[ShortCompletions, ...]
    audit: Audit

    @property
    def problems(self) -> list[str]:
        """The findings that must be fixed (``jobguard doctor`` exits 1), one line each."""
        return [f.line for f in self.findings if f.severity == Severity.PROBLEM]

    @property
    def warnings(self) -> list[str]:
        """The findings that deserve a look but do not change the exit code, one line each."""
        return [f.line for f in self.findings if f.severity == Severity.WARNING]

    @property
    def hints(self) -> list[str]:
        """Advice that needs no action, one line each."""
        return [f.line for f in self.findings if f.severity == Severity.HINT]


def diagnose(snapshot: Snapshot) -> Diagnosis:
    """Run every check over ``snapshot`` (pure: no I/O)."""
    attempts = snapshot.attempts
    jobs = snapshot.jobs
    in_scope = snapshot.jobs_in_scope()
    outages = find_outages(attempts)
    errors = repeated_errors(attempts, outages={(o.task, o.signature) for o in outages})
    overlaps = find_overlaps(attempts, jobs, snapshot.now)
    resource_overlaps = find_resource_overlaps(attempts, jobs, snapshot.now)
    slot_overruns = find_slot_overruns(attempts, jobs, snapshot.now)
    refused = fence_refusals(attempts)
    resources = resource_use(attempts, jobs, snapshot.now)
    durations = task_durations(attempts, jobs)
    retries = retry_rates(attempts)
    crash_loops = find_crash_loops(attempts, jobs)
    deaths = worker_deaths(attempts, jobs)
    stalls = find_stalls(attempts)
    splits = split_operations(in_scope)
    unstable = unstable_keys(in_scope)
    shorts = short_completions(attempts, snapshot.operations)
    checked = audit(in_scope, jobs.values(), snapshot.operations, snapshot.now)
    crashed_operations = {key for loop in crash_loops for key in loop.operation_keys}
    findings = [
        *overlap_findings(overlaps),
        *resource_findings(resources, resource_overlaps, refused, jobs, slot_overruns),
        *timeout_findings(durations),
        *outage_findings(outages, jobs),
        *crash_findings(crash_loops),
        *death_findings(deaths),
        *stall_findings(stalls),
        *dedup_findings(splits, unstable),
        *spike_findings(retries),
        *poison_findings(errors),
        *completion_findings(shorts, checked, crashed_operations),
    ]
    findings.sort(key=lambda f: SEVERITY_ORDER[f.severity])
    return Diagnosis(
        now=snapshot.now,
        task=snapshot.task,
        since=snapshot.since,
        attempts=len(attempts),
        findings=tuple(findings),
        overlaps=tuple(overlaps),
        resource_overlaps=tuple(resource_overlaps),
        resources=tuple(resources),
        slots=tuple(slot_use(attempts, jobs, snapshot.now)),
        slot_overruns=tuple(slot_overruns),
        durations=tuple(durations),
        retries=tuple(retries),
        errors=tuple(errors),
        outages=tuple(outages),
        crash_loops=tuple(crash_loops),
        worker_deaths=deaths,
        stalls=tuple(stalls),
        split_operations=tuple(splits),
        unstable_dedup_keys=tuple(unstable),
        short_completions=tuple(shorts),
        audit=checked,
    )
