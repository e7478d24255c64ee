"""Turn result rows of any SQL driver into the frozen models."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from jobguard.backends.sql.driver import Row
from jobguard.core.messages import dead_reason
from jobguard.models import (
    Attempt,
    AuditEntry,
    DeadCode,
    Delivery,
    Job,
    JobStatus,
    Operation,
    OperationStatus,
    Outcome,
    QueueStats,
    ScheduleState,
)


def stored_json(text: Any) -> Any:
    """A stored result: its JSON value, or the text itself if it is not JSON (a row written by
    another tool or version), so that reading the record shows it instead of failing."""
    try:
        return json.loads(text)
    except (TypeError, ValueError, RecursionError):
        return text


def job(row: Row, *, deduplicated: bool = False) -> Job:
    """A ``jobs`` row as a :class:`Job`."""
    return Job(
        id=row["id"],
        task=row["task"],
        queue=row["queue"],
        payload=row["payload"],
        status=JobStatus(row["status"]),
        priority=row["priority"],
        attempts=row["attempts"],
        max_attempts=row["max_attempts"],
        deferrals=row["deferrals"],
        run_at=row["run_at"],
        created_at=row["created_at"],
        finished_at=row["finished_at"],
        visibility_timeout_s=row["visibility_timeout_s"],
        operation_key=row["operation_key"],
        resource_key=row["resource_key"],
        lock_ttl_s=row["lock_ttl_s"],
        dedup_key=row["dedup_key"],
        last_error=row["last_error"],
        dead_reason=dead_reason(
            row["dead_code"], row["dead_reason"], row["attempts"], row["max_attempts"]
        ),
        dead_code=DeadCode.stored(row["dead_code"]) if row["dead_code"] else None,
        headers=row["headers"],
        soft_time_limit_s=row["soft_time_limit_s"],
        time_limit_s=row["time_limit_s"],
        cancel_requested_at=row["cancel_requested_at"],
        cancel_requested_by=row["cancel_requested_by"],
        concurrency_key=row["concurrency_key"],
        concurrency_limit=row["concurrency_limit"],
        deduplicated=deduplicated,
    )


class _Numbers:
    """A leased row's numbers, each checked as it is read: a SQLite column takes any value
    (text in a REAL column, say), and a hand-made fix may store NaN or a negative count. What
    is not a number of the kind this version writes is named in :attr:`problems` and read as
    the stand-in given (a whole number as itself), so the delivery can still be held, reported
    and buried."""

    def __init__(self, row: Row) -> None:
        self.row = row
        self.problems: list[str] = []

    def read(
        self,
        column: str,
        stand_in: Any,
        *,
        whole: bool = False,
        positive: bool = False,
        stored_as: str | None = None,
    ) -> Any:
        """The column's value, or ``stand_in`` with the problem noted (under ``stored_as``,
        the name of the stored column it comes from, if the row names it otherwise)."""
        value = self.row[column]
        if value is None and stand_in is None:
            return None
        kind = int if whole else (int, float)
        if (
            isinstance(value, kind)
            and not isinstance(value, bool)
            and math.isfinite(value)
            and (value > 0 if positive else value >= 0)
        ):
            return value
        wanted = "a whole number" if whole else "a number"
        self.problems.append(
            f"stored {stored_as or column} {value!r} is not {wanted}"
            f"{' above 0' if positive else ''}"
        )
        # A whole number out of range stays as stored: its readers cope with one (the store
        # reads a concurrency limit past the largest as the largest, and grants none below 1).
        return value if whole and type(value) is int else stand_in


def _finite(value: Any) -> float:
    """``value`` if it is a finite number, else 0 (long past)."""
    if isinstance(value, int | float) and math.isfinite(value):
        return float(value)
    return 0.0


def delivery(row: Row, attempt_id: int) -> Delivery:
    """A freshly leased ``jobs`` row as a :class:`Delivery`; a number it holds that this
    version would never write makes it ``unrunnable`` (the pipeline buries it, saying why)."""
    numbers = _Numbers(row)
    read = numbers.read
    leased = Delivery(
        job_id=row["id"],
        task=row["task"],
        queue=row["queue"],
        payload=row["payload"],
        attempt=read("attempts", 1, whole=True),
        max_attempts=read("max_attempts", 1, whole=True, positive=True),
        deferrals=read("deferrals", 0, whole=True),
        created_at=read("created_at", 0.0),
        lease_token=row["lease_token"],
        attempt_id=attempt_id,
        # Reckoned by the fetch from the lease length: if that is not a number, it is named.
        lease_expires_at=_finite(row["available_at"]),
        # The fetching worker's lease, or the stored one. A stand-in of a second: the delivery
        # is buried at once, and its heartbeat must still be able to choose an interval.
        visibility_timeout_s=read("lease_s", 1.0, positive=True, stored_as="visibility_timeout_s"),
        operation_key=row["operation_key"],
        resource_key=row["resource_key"],
        lock_ttl_s=read("lock_ttl_s", None, positive=True),
        error_signature=row["error_signature"],
        same_error_count=read("same_error_count", 0, whole=True),
        headers=row["headers"],
        soft_time_limit_s=read("soft_time_limit_s", None, positive=True),
        time_limit_s=read("time_limit_s", None, positive=True),
        cancel_requested_by=row["cancel_requested_by"],
        concurrency_key=row["concurrency_key"],
        concurrency_limit=read("concurrency_limit", None, whole=True, positive=True),
    )
    if numbers.problems:
        return replace(leased, unrunnable="; ".join(numbers.problems))
    return leased


def operation(row: Row, steps: Sequence[Row]) -> Operation:
    """An ``operations`` row and its ``steps`` rows as an :class:`Operation`."""
    return Operation(
        key=row["key"],
        status=OperationStatus.stored(row["status"]),
        resource_key=row["resource_key"],
        result=stored_json(row["result"]) if row["result"] is not None else None,
        external_ref=row["external_ref"],
        attempts=row["attempts"],
        fence=row["fence"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        completed_at=row["completed_at"],
        last_error=row["last_error"],
        steps={step["name"]: stored_json(step["result"]) for step in steps},
    )


def new_claim(key: str, resource_key: str | None, fence: int | None, now: float) -> Operation:
    """The ``operations`` row a begin inserts for a new claim (``insert_operations``, and on
    PostgreSQL ``begin_batch`` and ``lease_and_begin``), as an :class:`Operation`: known without
    reading it back."""
    return Operation(
        key=key,
        status=OperationStatus.PROCESSING,
        resource_key=resource_key,
        result=None,
        external_ref=None,
        attempts=1,
        fence=fence,
        created_at=now,
        updated_at=now,
        completed_at=None,
        last_error=None,
        steps={},
    )


def attempt(row: Row) -> Attempt:
    """An ``attempts`` row as an :class:`Attempt`."""
    return Attempt(
        id=row["id"],
        job_id=row["job_id"],
        attempt=row["attempt"],
        task=row["task"],
        queue=row["queue"],
        operation_key=row["operation_key"],
        worker_id=row["worker_id"],
        lease_token=row["lease_token"],
        lock_owner=row["lock_owner"],
        fence=row["fence"],
        started_at=row["started_at"],
        ended_at=row["ended_at"],
        duration_s=row["duration_s"],
        outcome=Outcome.stored(row["outcome"]),
        error_type=row["error_type"],
        error_message=row["error_message"],
        traceback=row["traceback"],
        steps_run=row["steps_run"],
        steps_skipped=row["steps_skipped"],
        host_delivery=row["host_delivery"],
    )


def queue_stats(queue: str, values: Mapping[str, Any]) -> QueueStats:
    """The per-queue reads' columns (absent: none of that kind) as :class:`QueueStats`."""
    return QueueStats(
        queue=queue,
        ready=int(values.get("ready") or 0),
        scheduled=int(values.get("scheduled") or 0),
        running=int(values.get("running") or 0),
        dead=int(values.get("dead") or 0),
        oldest_ready_at=values.get("oldest_ready_at"),
        oldest_running_since=values.get("oldest_running_since"),
        shortest_lease_s=values.get("shortest_lease_s"),
        paused=bool(values.get("paused")),
    )


def audit_entry(row: Row) -> AuditEntry:
    """An ``audit`` row as an :class:`AuditEntry`."""
    return AuditEntry(
        id=row["id"],
        at=row["at"],
        actor=row["actor"],
        action=row["action"],
        target=row["target"],
        detail=row["detail"],
    )


def schedule_state(row: Row) -> ScheduleState:
    """A ``schedules`` row as a :class:`ScheduleState`."""
    return ScheduleState(
        name=row["name"],
        cursor=row["cursor"],
        last_tick=row["last_tick"],
        last_job_id=row["last_job_id"],
        updated_at=row["updated_at"],
    )
