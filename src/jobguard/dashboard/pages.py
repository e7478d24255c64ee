"""What each page shows: functions from the app and validated parameters to a template context.

Reads go through the :class:`~jobguard.App` (and the diagnostics' port-only snapshot); nothing
here knows HTTP. Each returns ``(template name, context)``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from jobguard.app import App
from jobguard.dashboard import charts, params
from jobguard.diagnostics import diagnose, read_snapshot
from jobguard.diagnostics.durations import RAN_HANDLER
from jobguard.exceptions import NotFoundError
from jobguard.models import DeadCode, JobStatus, QueueStats

Page = tuple[str, dict[str, Any]]
Params = Mapping[str, list[str]]
TIMELINE_BUCKETS = 60
MAX_ATTEMPTS_SHOWN = 200
DOCTOR_LIMIT = 5000


def overview(app: App, query: Params) -> Page:
    """Per queue depth, in flight, oldest ages; attempts per interval over the window."""
    params.check_known(query, {"since", "notice"})
    since_s = params.since_s(query, 3600)
    notice = params.single(query, "notice")
    now = app.backend.now()
    found = {stats.queue: stats for stats in app.queue_stats()}
    for queue in app.queues():
        found.setdefault(queue, QueueStats(queue))
    bucket_s = charts.nice_buckets(since_s, TIMELINE_BUCKETS)
    window = bucket_s * TIMELINE_BUCKETS
    counts = app.outcome_timeline(window, bucket_s)
    rows = []
    for stats in sorted(found.values(), key=lambda s: s.queue):
        running_age = (
            None if stats.oldest_running_since is None else now - stats.oldest_running_since
        )
        rows.append(
            {
                "stats": stats,
                "oldest_ready_s": None
                if stats.oldest_ready_at is None
                else max(0.0, now - stats.oldest_ready_at),
                "running_age_s": running_age,
                "gauge": charts.lease_gauge(running_age, stats.shortest_lease_s),
            }
        )
    completed = sum(c.count for c in counts if c.outcome in charts.GOOD)
    failed = sum(c.count for c in counts if c.outcome in charts.BAD)
    # An empty table is not an empty store: say what the store holds when no queue shows.
    totals = app.counts() if not rows else {}
    return "overview.html", {
        "rows": rows,
        "stored_jobs": sum(totals.values()),
        "completed_jobs": totals.get(JobStatus.COMPLETED, 0),
        "chart": charts.throughput(counts, now - window, bucket_s, TIMELINE_BUCKETS),
        "window_s": window,
        "bucket_s": bucket_s,
        "completed": completed,
        "failed": failed,
        "seconds": charts.seconds,
        "notice": notice if notice in ("paused", "resumed") else None,
    }


def jobs(app: App, query: Params) -> Page:
    """Jobs newest first, filtered by status, queue and task, a page at a time."""
    params.check_known(query, {"status", "queue", "task", "page"})
    status = params.status(query)
    queue = params.name(query, "queue")
    task = params.name(query, "task")
    page = params.page(query)
    found = app.find_jobs(
        status=status,
        queue=queue,
        task=task,
        limit=params.PAGE_SIZE + 1,
        offset=(page - 1) * params.PAGE_SIZE,
    )
    filters = {"status": status.value if status else "", "queue": queue or "", "task": task or ""}
    return "jobs.html", {
        "jobs": found[: params.PAGE_SIZE],
        "page": page,
        "has_next": len(found) > params.PAGE_SIZE and page < params.MAX_PAGE,
        "filters": filters,
        "statuses": [s.value for s in JobStatus],
        "queues": sorted({s.queue for s in app.queue_stats()} | set(app.queues())),
    }


def _pretty(payload: str) -> str:
    try:
        return json.dumps(json.loads(payload), indent=2, ensure_ascii=False)
    except ValueError:
        return payload


# What the job page says after an action: replayed, due now, cancelled, or told to stop.
JOB_NOTICES = ("replayed", "retried", "cancelled", "cancel-requested")


def job(app: App, job_id_text: str, query: Params) -> Page:
    """One job: its fields, arguments, operation record and attempt timeline."""
    params.check_known(query, {"notice"})
    job_id = params.job_id(job_id_text)
    try:
        found = app.get_job(job_id)
    except NotFoundError:
        raise params.NotFound(f"there is no job {job_id}") from None
    attempts = app.attempts(job_id=job_id)[-MAX_ATTEMPTS_SHOWN:]
    operation = app.operation(found.operation_key) if found.operation_key else None
    now = app.backend.now()
    notice = params.single(query, "notice")
    return "job.html", {
        "job": found,
        "payload": _pretty(found.payload),
        "attempts": attempts,
        "operation": operation,
        "timeline": charts.timeline(attempts, now),
        "dead": found.status == JobStatus.DEAD,
        "live": found.status in (JobStatus.QUEUED, JobStatus.RUNNING),
        # Queued with its run time ahead: a retry's backoff, a delay or a busy lock.
        "waiting": found.status == JobStatus.QUEUED and found.run_at > now,
        "notice": notice if notice in JOB_NOTICES else None,
        "seconds": charts.seconds,
    }


def operations(app: App, query: Params) -> Page:
    """The operation ledger: one record by key, its steps and every attempt of it."""
    params.check_known(query, {"key"})
    key = params.key(query)
    if key is None:
        return "operations.html", {"key": "", "operation": None, "attempts": []}
    operation = app.operation(key)
    attempts = app.attempts(operation_key=key)[-MAX_ATTEMPTS_SHOWN:]
    if operation is None and not attempts:
        raise params.NotFound(f"no operation record and no attempt for key {key!r}")
    steps = {
        name: json.dumps(value, ensure_ascii=False)
        for name, value in (operation.steps if operation else {}).items()
    }
    return "operations.html", {
        "key": key,
        "operation": operation,
        "steps": steps,
        "attempts": attempts,
        "timeline": charts.timeline(attempts, app.backend.now()),
        "seconds": charts.seconds,
    }


def dlq(app: App, query: Params) -> Page:
    """Dead jobs, newest first, with replay and purge forms."""
    params.check_known(query, {"page", "notice"})
    page = params.page(query)
    found = app.find_jobs(
        status=JobStatus.DEAD,
        limit=params.PAGE_SIZE + 1,
        offset=(page - 1) * params.PAGE_SIZE,
    )
    notice = params.single(query, "notice")
    return "dlq.html", {
        "jobs": found[: params.PAGE_SIZE],
        "page": page,
        "has_next": len(found) > params.PAGE_SIZE and page < params.MAX_PAGE,
        "notice": notice if notice in ("purged", "purged-none") else None,
        "dead_codes": [code.value for code in DeadCode],
    }


PREVIEW_ROWS = 10


def dlq_bulk(app: App, query: Params) -> Page:
    """What a bulk replay or purge would touch: the count, the first rows, the two forms."""
    params.check_known(query, set(params.SELECTION_FIELDS))
    selected = params.selection(query)
    preview = app.dlq.preview(selected, PREVIEW_ROWS)
    return "dlq_bulk.html", {
        "count": preview.count,
        "held": preview.held,
        "jobs": preview.first,
        "described": selected.describe(),
        "cutoff": params.cutoff_text(preview.selection),
        "cutoff_shown": preview.cutoff_text,
        "fields": params.selection_fields(query),
    }


def doctor(app: App, query: Params) -> Page:
    """The doctor's findings drawn: overlaps, duration histograms, retries, poison."""
    params.check_known(query, {"task", "since"})
    task = params.name(query, "task")
    since = params.single(query, "since")
    since_s = None if since is None else params.since_s(query, 3600)
    snapshot = read_snapshot(app.backend, task=task, since_s=since_s, limit=DOCTOR_LIMIT)
    diagnosis = diagnose(snapshot)
    durations: dict[str, list[float]] = {}
    for attempt in snapshot.attempts:
        if attempt.outcome in RAN_HANDLER and attempt.duration_s is not None:
            durations.setdefault(attempt.task, []).append(attempt.duration_s)
    histograms = []
    for stats in diagnosis.durations:
        lines = []
        if stats.visibility_timeout_s is not None:
            lines.append(charts.Line(stats.visibility_timeout_s, "visibility timeout", "#c62828"))
        if stats.lock_ttl_s is not None:
            lines.append(charts.Line(stats.lock_ttl_s, "lock TTL", "#ef6c00"))
        histograms.append(
            {"stats": stats, "chart": charts.histogram(durations.get(stats.task, []), lines)}
        )
    overlaps = [
        {
            "overlap": found,
            "chart": charts.overlap(
                (f"#{found.first.attempt} {found.first.worker_id}", found.first.started_at,
                 found.first.ended_at),
                (f"#{found.second.attempt} {found.second.worker_id}", found.second.started_at,
                 found.second.ended_at),
            ),
        }
        for found in diagnosis.overlaps
    ]  # fmt: skip
    return "doctor.html", {
        "diagnosis": diagnosis,
        "histograms": histograms,
        "overlaps": overlaps,
        "task": task or "",
        "since": since or "",
        "seconds": charts.seconds,
    }


def audit(app: App, query: Params) -> Page:
    """The audit trail: who replayed or purged what, when."""
    params.check_known(query, set())
    return "audit.html", {"entries": app.audit_trail(200)}
