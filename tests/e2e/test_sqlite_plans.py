"""SQLite plans every statement that takes a list of items (``:items``) item by item, by key.

Such a statement joins ``json_each(:items)`` to a table. Led by the items, each row is found by
its key: the cost follows the batch. Led by the table, SQLite visits every row an index gives
it (say every running job, every worker's, through the status index) and scans the items for
each: the cost follows the whole table times the batch. The settle and the lease renewal were
planned the second way once, and a drain of plain jobs ran at about half its speed
(docs/performance.md, "SQLite alone"). SQLite has no statistics of a table-valued function, so
the plan is read here from ``EXPLAIN QUERY PLAN``, on a store with running and finished jobs,
before and after ``ANALYZE``.
"""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

import pytest

from jobguard.backends import migrate_store
from jobguard.backends.sqlite.driver import Q

TABLES = ("jobs", "attempts", "locks", "operations", "slots", "steps")
ITEM_STATEMENTS = sorted(name for name, text in Q.items() if ":items" in text)
ITEM = {
    "job_id": 1, "lease_token": "lease", "resource": "res", "fence": 1, "slot_key": None,
    "slot": None, "slot_fence": None, "key": "op", "status": "completed", "delay_s": None,
    "uncharge": 0, "deferral": 0, "set_error": 0, "last_error": None, "set_signature": 0,
    "error_signature": None, "same_error_count": 0, "code": None, "reason": None,
    "visibility_timeout_s": 30, "attempt_id": 1, "worker_id": "w", "outcome": "completed",
    "owner": "w", "ttl_s": 30, "limit": 2, "id": 1,
}  # fmt: skip


def store_with_jobs(folder: Path) -> sqlite3.Connection:
    """A migrated store holding running and finished jobs."""
    path = folder / "plans.db"
    migrate_store(f"sqlite:///{path}")
    conn = sqlite3.connect(path)
    columns = {row[1] for row in conn.execute("PRAGMA table_info(jobs)")}
    assert {"status", "lease_token", "queue", "task"} <= columns
    conn.execute(
        "INSERT INTO jobs (queue, task, payload, status, lease_token, created_at, available_at,"
        " run_at, max_attempts, visibility_timeout_s) SELECT 'q', 't', '{}', CASE WHEN"
        " value % 5 = 0 THEN 'running' ELSE 'completed' END, CASE WHEN value % 5 = 0 THEN"
        " 'lease-' || value END, 0, 0, 0, 3, 30 FROM json_each(?)",
        (json.dumps(list(range(2000))),),
    )
    conn.commit()
    return conn


def plan_of(conn: sqlite3.Connection, name: str) -> list[str]:
    """SQLite's plan for statement ``name`` with one item and every other parameter NULL."""
    text = Q[name]
    params: dict[str, object] = {found: None for found in re.findall(r":(\w+)", text)}
    params["items"] = json.dumps([ITEM])
    params["now"] = 1.0
    return [row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {text}", params)]


def whole_table_visits(plan: list[str]) -> list[str]:
    """The steps of ``plan`` that visit a table's rows without a key from the items."""
    visits = []
    for step in plan:
        table = re.match(r"(SCAN|SEARCH) (\w+)", step)
        if table is None or table.group(2) not in TABLES:
            continue
        if step.startswith("SCAN") or "USING INDEX jobs_status (status=?)" in step:
            visits.append(step)
    return visits


@pytest.mark.parametrize("analyzed", [False, True], ids=["fresh", "analyzed"])
def test_every_item_statement_finds_its_rows_by_the_items_keys(
    tmp_path: Path, analyzed: bool
) -> None:
    conn = store_with_jobs(tmp_path)
    if analyzed:
        conn.execute("ANALYZE")
    assert {"settle_jobs", "extend_leases"} <= set(ITEM_STATEMENTS)
    found = {name: whole_table_visits(plan_of(conn, name)) for name in ITEM_STATEMENTS}
    assert {name: visits for name, visits in found.items() if visits} == {}
