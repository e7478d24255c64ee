"""``jobguard doctor``: overlaps, resources, concurrency limits, durations against timeouts,
failures, crash loops, unstable keys and an audit (G10.2-G10.5), ending with the findings.

Exit code 1 when a finding is a problem, 0 otherwise; warnings and hints are printed but do not
change the exit code.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence

import click
from rich.console import Console
from rich.text import Text

from jobguard.cli.jobs_cmd import (
    LIMIT,
    console,
    dash,
    duration,
    emit_json,
    safe_text,
    table,
    when,
)
from jobguard.cli.state import CliState
from jobguard.core import checks
from jobguard.core.text import utc_text
from jobguard.diagnostics import Audit, Diagnosis, Overlap, Run, Severity, TaskDurations
from jobguard.diagnostics.resources import ResourceUse, SlotUse
from jobguard.diagnostics.retries import RECENT_RUNS

RESOURCE_ROWS = 10
STYLES = {Severity.PROBLEM: "bold red", Severity.WARNING: "yellow", Severity.HINT: ""}

EXIT_PROBLEMS = 1


def _instant(ts: float) -> str:
    """Store seconds as ``HH:MM:SS.mmm`` UTC: overlaps are often shorter than a second."""
    shown = utc_text(ts, "%H:%M:%S.%f")
    return shown[:-3] if shown[-1].isdigit() else shown


def _heading(out: Console, title: str) -> None:
    out.print()
    out.print(safe_text(title, style="bold underline"))


def _run_line(label: str, run: Run) -> Text:
    return safe_text(
        f"  {label + ':':7} attempt {run.attempt_id} (job {run.job_id} delivery #{run.attempt}) "
        f"on {run.worker_id}, lease {run.lease_token}, fence {dash(run.fence)}, "
        f"{run.outcome.value}, {_instant(run.started_at)} -> {_instant(run.ended_at)} UTC"
    )


def _print_overlaps(out: Console, overlaps: Sequence[Overlap]) -> None:
    _heading(out, "Overlaps (G10.2)")
    if not overlaps:
        out.print("  none: no operation ran on two deliveries at the same time")
        return
    for overlap in overlaps:
        out.print(
            safe_text(
                f"{overlap.key}: two deliveries ran at once for {duration(overlap.overlap_s)}",
                style="bold red",
            )
        )
        out.print(_run_line("first", overlap.first))
        out.print(_run_line("second", overlap.second))
        for number, cause in enumerate(overlap.causes):
            out.print(safe_text(f"  {'likely cause' if number == 0 else 'also'}: {cause}"))


def _print_durations(out: Console, durations: Sequence[TaskDurations]) -> None:
    _heading(out, "Durations vs timeouts (G10.3)")
    if not durations:
        out.print("  no measured runs")
        return
    out.print(
        table(
            "",
            ["task", "runs", "p50", "p95", "p99", "max", "visibility timeout", "lock TTL"],
            (
                [
                    d.task,
                    d.runs,
                    duration(d.p50_s),
                    duration(d.p95_s),
                    duration(d.p99_s),
                    duration(d.max_s),
                    # A host queue's task: its host's limit, the one that redelivers it.
                    duration(d.visibility_timeout_s)
                    if d.host_limit is None
                    else f"{duration(d.host_limit.timeout_s)} ({d.host_limit.host})",
                    duration(d.lock_ttl_s),
                ]
                for d in durations
            ),
        )
    )
    advice = [(d.task, a) for d in durations for a in d.advice]
    if not advice:
        out.print("  every timeout leaves room above the slowest runs")
    for task, item in advice:
        out.print(
            safe_text(
                f"  {item.severity.value}: {task}: {item.message}", style=STYLES[item.severity]
            )
        )


def _print_retries(out: Console, diagnosis: Diagnosis) -> None:
    _heading(out, "Retries and repeating errors (G10.4)")
    if not diagnosis.retries:
        out.print("  no handler runs")
    else:
        out.print(
            table(
                "",
                [
                    "task",
                    "runs",
                    "retries",
                    "dead",
                    "retry rate",
                    f"failed, last {RECENT_RUNS} runs",
                    "spike",
                ],
                (
                    [
                        r.task,
                        r.runs,
                        r.retries,
                        r.dead,
                        f"{r.retry_rate:.0%}",
                        f"{r.recent_failure_rate:.0%} of {r.recent_runs}",
                        "SPIKE" if r.spike else "-",
                    ]
                    for r in diagnosis.retries
                ),
            )
        )
    if not diagnosis.errors:
        out.print("  no error repeated")
        return
    out.print(
        table(
            "errors seen more than once, most frequent first",
            ["task", "error", "where", "attempts", "jobs", "example jobs", "poison candidate"],
            (
                [
                    e.task,
                    f"{e.error_type}: {e.message}",
                    e.where,
                    e.attempts,
                    e.jobs,
                    ", ".join(str(job_id) for job_id in e.job_ids),
                    (
                        f"yes ({e.max_per_job}x on one job)"
                        if e.poison
                        else ("no: an outage" if e.outage else "-")
                    ),
                ]
                for e in diagnosis.errors
            ),
        )
    )


def _contention_cells(u: ResourceUse | SlotUse) -> list[object]:
    """What a row of the resource locks and the concurrency limits tables share: task, jobs,
    deferrals, waited, ran, and the longest holder."""
    longest = f"{u.longest_holder} ({duration(u.longest_hold_s)})" if u.longest_holder else "-"
    return [u.task, u.jobs, u.deferrals, duration(u.wait_s), duration(u.run_s), longest]


def _print_resources(out: Console, diagnosis: Diagnosis) -> None:
    _heading(out, "Resource locks")
    uses = [u for u in diagnosis.resources if u.deferrals or u.starved]
    if not diagnosis.resources:
        out.print("  no job takes a resource lock")
    elif not uses:
        out.print("  no lock-busy deferral")
    else:
        out.print(
            table(
                f"the {RESOURCE_ROWS} most deferred resource keys and tasks",
                ["resource", "task", "jobs", "deferrals", "waited", "ran", "longest holder"],
                ([u.resource_key, *_contention_cells(u)] for u in uses[:RESOURCE_ROWS]),
            )
        )
    if not diagnosis.resource_overlaps:
        out.print("  none: no two operations ran at once under one resource lock")
    for overlap in diagnosis.resource_overlaps:
        out.print(
            safe_text(
                f"{overlap.resource_key}: {overlap.first_operation or overlap.first_task} and "
                f"{overlap.second_operation or overlap.second_task} ran at once for "
                f"{duration(overlap.overlap_s)}",
                style="bold red",
            )
        )
        out.print(_run_line("first", overlap.first))
        out.print(_run_line("second", overlap.second))
        out.print(safe_text(f"  likely cause: {overlap.cause}"))


def _print_slots(out: Console, diagnosis: Diagnosis) -> None:
    _heading(out, "Concurrency limits")
    uses = [u for u in diagnosis.slots if u.deferrals]
    if not diagnosis.slots:
        out.print("  no job has a concurrency limit")
        return
    if not uses:
        out.print("  no slot-busy deferral")
    else:
        out.print(
            table(
                f"the {RESOURCE_ROWS} most deferred concurrency keys and tasks",
                ["key", "limit", "task", "jobs", "deferrals", "waited", "ran", "longest holder"],
                (
                    [u.concurrency_key, dash(u.limit), *_contention_cells(u)]
                    for u in uses[:RESOURCE_ROWS]
                ),
            )
        )
    if not diagnosis.slot_overruns:
        out.print("  none: no concurrency key ran more deliveries at once than its limit")
    for overrun in diagnosis.slot_overruns:
        out.print(
            safe_text(
                f"{overrun.concurrency_key}: {len(overrun.runs)} ran at once for "
                f"{duration(overrun.overrun_s)}, limit {overrun.limit}",
                style="bold red",
            )
        )
        for run in overrun.runs:
            out.print(_run_line("run", run))


def _print_audit(out: Console, audit: Audit, crashed: Collection[str]) -> None:
    _heading(out, "Audit (G10.5)")
    out.print(
        f"  {audit.completed_jobs_with_key} completed jobs with an operation key; "
        f"{audit.operations_completed} operations completed: {audit.with_external_ref} with an "
        f"external reference, {audit.without_external_ref} without"
    )
    for traces in audit.by_task:
        line = (
            f"  {traces.task}: {traces.completed} completed, {traces.with_external_ref} with "
            f"an external reference, {traces.without_external_ref} without"
        )
        if traces.examples_without:
            line += f" (e.g. {', '.join(traces.examples_without)})"
        out.print(safe_text(line))
    missing = ", ".join(str(job_id) for job_id in audit.missing_records) or "none"
    out.print(safe_text(f"  completed jobs without a completed operation record: {missing}"))
    stuck = (
        ", ".join(
            f"{key} (a crash loop's culprit)" if key in crashed else key
            for key in audit.stuck_processing
        )
        or "none"
    )
    out.print(safe_text(f"  operations stuck in processing with no queued or running job: {stuck}"))


def _print(diagnosis: Diagnosis) -> None:
    out = console()
    scope = f"task {diagnosis.task}" if diagnosis.task else "every task"
    since = f"since {when(diagnosis.since)} UTC" if diagnosis.since is not None else "all read"
    out.print(safe_text(f"doctor: {diagnosis.attempts} attempts of {scope}, {since}", style="bold"))
    _print_overlaps(out, diagnosis.overlaps)
    _print_resources(out, diagnosis)
    _print_slots(out, diagnosis)
    _print_durations(out, diagnosis.durations)
    _print_retries(out, diagnosis)
    crashed = {key for loop in diagnosis.crash_loops for key in loop.operation_keys}
    _print_audit(out, diagnosis.audit, crashed)
    out.print()
    problems, warnings, hints = diagnosis.problems, diagnosis.warnings, diagnosis.hints
    if problems:
        out.print(safe_text(f"doctor: {len(problems)} problem(s) to fix", style="bold red"))
        for problem in problems:
            out.print(safe_text(f"  - {problem}"))
    else:
        out.print(safe_text("doctor: no problems found", style="bold green"))
    if warnings:
        out.print(safe_text(f"doctor: {len(warnings)} warning(s)", style="yellow"))
        for warning in warnings:
            out.print(safe_text(f"  - {warning}"))
    if hints:
        out.print(safe_text(f"doctor: {len(hints)} hint(s)"))
        for hint in hints:
            out.print(safe_text(f"  - {hint}"))


@click.command()
@click.option("--task", "task", default=None, metavar="NAME", help="Only this task.")
@click.option(
    "--since-s",
    default=None,
    type=click.FloatRange(0, checks.MAX_DURATION_S, min_open=True),
    help="Only attempts and jobs active in the last this many seconds.",
)
@click.option(
    "--limit",
    default=5000,
    show_default=True,
    type=LIMIT,
    help="Read at most this many recent attempts (and newest jobs).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.pass_context
def doctor(
    ctx: click.Context, task: str | None, since_s: float | None, limit: int, as_json: bool
) -> None:
    """Name why work ran twice, failed or got stuck, from the attempt log.

    Exits 1 when a finding is a problem (an overlap, a crash loop, a mass burial, ...); 0
    otherwise.
    """
    state: CliState = ctx.obj
    diagnosis = state.inspecting_app().diagnose(task=task, since_s=since_s, limit=limit)
    if as_json:
        report = {
            "problems": diagnosis.problems,
            "warnings": diagnosis.warnings,
            "hints": diagnosis.hints,
            **dataclasses.asdict(diagnosis),
        }
        emit_json(report)
    else:
        _print(diagnosis)
    if diagnosis.problems:
        ctx.exit(EXIT_PROBLEMS)
