"""End-to-end: ``jobguard demo`` keeps the shop correct under fire; ``--unsafe`` breaks it.

The demo runs as a real command (worker processes SIGKILLed and frozen, a real local mail API
with faults, SQLite on disk). Its JSON report is never taken on trust: every number is recomputed
here, independently, from the database file and the mail service's log it leaves behind, so the
report cannot say 0 where the tables say otherwise.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import sqlite3
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from jobguard.demo import report as demo_report
from jobguard.demo.faults import FaultPlan
from jobguard.demo.settings import DemoFiles
from tests.support.procs import clean_env

REPO_ROOT = Path(__file__).resolve().parents[2]
ORDERS = 40
WORKERS = 3
SEED = 11
RUN_TIMEOUT_S = 150.0


@dataclass
class DemoRun:
    """One finished ``jobguard demo --json`` run and the files it left."""

    returncode: int
    report: dict[str, Any]
    files: DemoFiles
    stderr: str

    @contextlib.contextmanager
    def db(self) -> Iterator[sqlite3.Connection]:
        """A connection to the run's database file, closed afterwards."""
        conn = sqlite3.connect(self.files.db)
        conn.row_factory = sqlite3.Row
        try:
            yield conn
        finally:
            conn.close()

    def mail_log(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.files.mail_log.read_text("utf-8"))
        return data


def run_demo(directory: Path, *extra: str) -> DemoRun:
    """Run the demo command in a fresh interpreter, as a user would."""
    db = directory / "shop.db"
    command = [
        sys.executable,
        "-c",
        "from jobguard.cli.main import main; main()",
        "demo",
        "--orders", str(ORDERS),
        "--workers", str(WORKERS),
        "--seed", str(SEED),
        "--db", str(db),
        "--json",
        *extra,
    ]  # fmt: skip
    env = clean_env()
    done = subprocess.run(
        command,
        cwd=directory,
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )
    assert done.stdout.strip(), f"no report; stderr:\n{done.stderr[-3000:]}"
    return DemoRun(done.returncode, json.loads(done.stdout), DemoFiles.beside(db), done.stderr)


@pytest.fixture(scope="module")
def safe_run(tmp_path_factory: pytest.TempPathFactory) -> DemoRun:
    """The demo with every protection on (run once for the tests of this module)."""
    return run_demo(tmp_path_factory.mktemp("safe"))


@pytest.fixture(scope="module")
def unsafe_run(tmp_path_factory: pytest.TempPathFactory) -> DemoRun:
    """The same workload and faults with the protections off."""
    return run_demo(tmp_path_factory.mktemp("unsafe"), "--unsafe")


def per_order_counts(conn: sqlite3.Connection, table: str) -> Counter[int]:
    """How many rows ``table`` (invoices or stock_movements) holds per order id."""
    assert table in ("invoices", "stock_movements")
    rows = conn.execute(f"SELECT order_id, count(*) FROM {table} GROUP BY order_id").fetchall()
    return Counter({row[0]: row[1] for row in rows})


def emails_per_order(run: DemoRun) -> Counter[int]:
    """Emails the mail service actually sent, per order (from its log, by recipient)."""
    counts: Counter[int] = Counter()
    for sent in run.mail_log()["sent"]:
        match = re.fullmatch(r"customer-(\d+)@shop\.example", str(sent["to"]))
        assert match, f"email to an unknown recipient: {sent}"
        counts[int(match.group(1))] += 1
    return counts


def extra(counts: Counter[int]) -> int:
    return sum(n - 1 for n in counts.values() if n > 1)


def poison_orders(conn: sqlite3.Connection) -> set[int]:
    """Orders whose data is invalid, read straight from the orders table."""
    rows = conn.execute(
        "SELECT o.id FROM orders o LEFT JOIN products p ON p.id = o.product_id "
        "WHERE o.quantity < 1 OR p.id IS NULL OR o.email NOT LIKE '%@%'"
    ).fetchall()
    return {row[0] for row in rows}


def test_safe_demo_exits_zero_with_zero_duplicates_and_nothing_lost(safe_run: DemoRun) -> None:
    """The README's demo ends in a zero-duplicate, zero-lost report and exit 0."""
    report = safe_run.report
    assert safe_run.returncode == 0, safe_run.stderr[-3000:]
    assert report["exit_code"] == 0
    assert report["ok"] is True
    assert report["mode"] == "safe"
    assert report["timed_out"] is False
    assert report["duplicates"] == {"invoices": 0, "stock_cuts": 0, "emails": 0, "total": 0}
    assert report["lost"] == 0
    assert all(item["ok"] for item in report["invariants"]), report["invariants"]
    shop = report["shop"]
    assert shop["orders"] == ORDERS
    assert shop["fulfilled"] + shop["in_dlq"] == ORDERS


def test_safe_report_matches_the_shop_tables(safe_run: DemoRun) -> None:
    """Every shop number in the report is what the tables say (G4.5)."""
    report = safe_run.report
    with safe_run.db() as conn:
        invoices = per_order_counts(conn, "invoices")
        cuts = per_order_counts(conn, "stock_movements")
        units = conn.execute("SELECT coalesce(sum(quantity), 0) FROM stock_movements").fetchone()[0]
        shelves = conn.execute("SELECT sum(initial_stock - stock) FROM products").fetchone()[0]
        wrong = conn.execute(
            "SELECT count(*) FROM stock_movements m JOIN orders o ON o.id = m.order_id "
            "WHERE m.quantity != o.quantity OR m.product_id != o.product_id"
        ).fetchone()[0]
        completed = {
            int(row[0].split(":")[1])
            for row in conn.execute("SELECT key FROM operations WHERE status = 'completed'")
        }
        unique_on_order = conn.execute(
            "SELECT count(*) FROM pragma_index_list('invoices') AS i "
            "JOIN pragma_index_info(i.name) AS c WHERE i.[unique] AND c.name = 'order_id'"
        ).fetchone()[0]
        poison = poison_orders(conn)
    emails = emails_per_order(safe_run)
    assert max(invoices.values()) == 1
    assert extra(invoices) == report["duplicates"]["invoices"] == 0
    assert max(cuts.values()) == 1
    assert extra(cuts) == report["duplicates"]["stock_cuts"] == 0
    assert units == shelves == report["shop"]["stock_units_cut"]
    assert wrong == 0
    assert sum(invoices.values()) == report["shop"]["invoices"]
    assert sum(cuts.values()) == report["shop"]["stock_cuts"]
    assert unique_on_order == 1, "the safe schema states one invoice per order in storage"
    # Fulfilled means all three effects exactly once, under a completed operation record.
    fulfilled = {o for o in completed if invoices[o] == cuts[o] == emails[o] == 1}
    assert fulfilled == completed
    assert len(fulfilled) == report["shop"]["fulfilled"] == ORDERS - len(poison)
    assert report["shop"]["in_dlq"] == len(poison)
    assert not poison & (set(invoices) | set(cuts)), "poison orders have no effects"


def test_safe_report_matches_the_mail_log(safe_run: DemoRun) -> None:
    """One email per fulfilled order, naming its one invoice, despite mail faults (G4.4)."""
    log = safe_run.mail_log()
    emails = emails_per_order(safe_run)
    assert len(log["sent"]) == safe_run.report["shop"]["emails_sent"] == sum(emails.values())
    assert len(log["requests"]) == safe_run.report["shop"]["mail_requests"]
    assert extra(emails) == safe_run.report["duplicates"]["emails"] == 0
    assert all(sent["key"] for sent in log["sent"]), "every email carries an Idempotency-Key"
    replays = [
        r for r in log["requests"] if r["key"] and not r["applied"] and r["fault"] != "error"
    ]
    assert len(replays) == safe_run.report["layers"]["email_replays"]["count"]
    with safe_run.db() as conn:
        numbers = dict(conn.execute("SELECT order_id, number FROM invoices").fetchall())
    for sent in log["sent"]:
        order_id = int(str(sent["to"]).split("-")[1].split("@")[0])
        assert numbers[order_id] in sent["subject"], "the email names the order's only invoice"


def test_safe_report_layer_counters_match_the_store(safe_run: DemoRun) -> None:
    """Each layer's counter is the store's own record of it, and each layer caught something.

    G2.4 stale leases, G3.4 deferrals, G3.5 fences, G4.3 already processed, G5.1 memoised
    steps, G6.1 dedup hits, G7.2 retries, G8.1 poison in the DLQ.
    """
    layers = {key: value["count"] for key, value in safe_run.report["layers"].items()}
    plan = FaultPlan.build(SEED, ORDERS)
    with safe_run.db() as conn:
        outcomes = dict(
            conn.execute("SELECT outcome, count(*) FROM attempts GROUP BY 1").fetchall()
        )
        dedup_hits = conn.execute("SELECT sum(dedup_hits) FROM jobs").fetchone()[0]
        skipped = conn.execute("SELECT sum(steps_skipped) FROM attempts").fetchone()[0]
        dead = conn.execute(
            "SELECT json_extract(payload, '$.order_id'), dead_reason FROM jobs "
            "WHERE status = 'dead'"
        ).fetchall()
        events = dict(conn.execute("SELECT kind, count(*) FROM demo_events GROUP BY 1").fetchall())
        poison = poison_orders(conn)
    assert layers["dedup_hits"] == dedup_hits > 0
    assert layers["already_processed"] == outcomes.get("already_processed", 0) > 0
    assert layers["memoised_steps"] == skipped > 0
    assert layers["stale_leases_refused"] == outcomes.get("lost", 0) + outcomes.get(
        "lease_refused", 0
    )
    assert outcomes.get("lost", 0) > 0, "SIGKILLed workers' leases were taken over"
    assert layers["stale_fences_refused"] == outcomes.get("fence_refused", 0) >= 1
    assert layers["lock_busy_deferrals"] == outcomes.get("deferred", 0) >= len(plan.held)
    assert layers["retries"] == outcomes.get("retry", 0)
    assert layers["poison_quarantined"] == len(dead)
    assert {order for order, _ in dead} == poison
    assert len(poison) == len(plan.poison)
    assert all("fatal error: ValidationError" in reason for _, reason in dead)
    assert events.get("worker_killed", 0) >= 1
    assert events.get("late_redelivery", 0) == len(plan.late)
    assert events.get("lock_taken_over", 0) >= 1
    assert safe_run.report["faults"]["observed"]["workers_killed"] == events["worker_killed"]


def test_frozen_workers_stale_writes_were_refused_by_the_fence(safe_run: DemoRun) -> None:
    """A worker frozen past its lock TTL wrote nothing with its old fence after waking (G3.5)."""
    with safe_run.db() as conn:
        refused = conn.execute(
            "SELECT operation_key, fence FROM attempts WHERE outcome = 'fence_refused'"
        ).fetchall()
        assert refused
        for row in refused:
            key, stale = row["operation_key"], row["fence"]
            steps = dict(
                conn.execute("SELECT name, fence FROM steps WHERE operation_key = ?", (key,))
            )
            operation = conn.execute(
                "SELECT status, fence FROM operations WHERE key = ?", (key,)
            ).fetchone()
            assert set(steps) == {"cut-stock", "create-invoice", "send-email"}
            # The frozen delivery had only cut the stock; whatever it tried after waking up was
            # refused, and a newer lock holder finished the operation.
            assert {name for name, fence in steps.items() if fence == stale} <= {"cut-stock"}
            assert operation["status"] == "completed"
            assert operation["fence"] > stale


def test_unsafe_demo_shows_double_invoices_stock_cuts_and_emails(unsafe_run: DemoRun) -> None:
    """Protections off: the article's symptoms appear, counted from the tables."""
    report = unsafe_run.report
    assert unsafe_run.returncode == 1
    assert report["exit_code"] == 1
    assert report["ok"] is False
    with unsafe_run.db() as conn:
        invoices = per_order_counts(conn, "invoices")
        cuts = per_order_counts(conn, "stock_movements")
        unique_on_order = conn.execute(
            "SELECT count(*) FROM pragma_index_list('invoices') AS i "
            "JOIN pragma_index_info(i.name) AS c WHERE i.[unique] AND c.name = 'order_id'"
        ).fetchone()[0]
        dedup_keys = conn.execute("SELECT count(dedup_key) FROM jobs").fetchone()[0]
    emails = emails_per_order(unsafe_run)
    assert unique_on_order == 0
    assert dedup_keys == 0
    assert extra(invoices) == report["duplicates"]["invoices"]
    assert extra(cuts) == report["duplicates"]["stock_cuts"]
    assert extra(emails) == report["duplicates"]["emails"]
    assert extra(invoices) + extra(cuts) > 0
    assert extra(emails) > 0
    assert not all(item["ok"] for item in report["invariants"])
    symptoms = {item["symptom"]: item for item in report["symptoms"]}
    assert symptoms["double invoices"]["count"] == extra(invoices)
    assert all(item["caught_by"] for item in report["symptoms"])


def test_report_cannot_say_zero_when_the_tables_hold_duplicates(
    safe_run: DemoRun, tmp_path: Path
) -> None:
    """Duplicates planted in a copy of the tables and mail log show in the report."""
    copy = DemoFiles.beside(tmp_path / "shop.db")
    shutil.copy(safe_run.files.db, copy.db)
    log = safe_run.mail_log()
    log["sent"].append(dict(log["sent"][0]))
    copy.mail_log.write_text(json.dumps(log), encoding="utf-8")
    with contextlib.closing(sqlite3.connect(copy.db)) as conn, conn:
        conn.execute(
            "INSERT INTO stock_movements (order_id, product_id, quantity, created_at) "
            "SELECT order_id, product_id, quantity, created_at FROM stock_movements LIMIT 1"
        )
    info = demo_report.RunInfo(
        mode="safe", seed=SEED, orders=ORDERS, workers=WORKERS, wall_time_s=0.0, timed_out=False
    )
    rebuilt = demo_report.build(copy, info)
    assert rebuilt["duplicates"]["stock_cuts"] == 1
    assert rebuilt["duplicates"]["emails"] == 1
    assert rebuilt["ok"] is False
    assert rebuilt["exit_code"] == 1


def test_demo_refuses_to_reuse_an_existing_database(tmp_path: Path) -> None:
    """``--db`` must name a new file: a used one would mix two runs' tables (exit 2)."""
    db = tmp_path / "shop.db"
    db.write_bytes(b"")
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "from jobguard.cli.main import main; main()",
            "demo",
            "--db",
            str(db),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "exists" in done.stderr


def test_fault_plan_is_reproducible_and_small_runs_meet_every_fault() -> None:
    """One seed, one plan; even a 40-order run meets each fault (the demo faults from --seed)."""
    plan = FaultPlan.build(SEED, ORDERS)
    assert plan == FaultPlan.build(SEED, ORDERS)
    assert plan != FaultPlan.build(SEED + 1, ORDERS)
    summary = plan.summary()
    assert all(count >= 1 for count in summary.values()), summary
    assert sorted(order for _, order in plan.deliveries()) == sorted(
        order for order, copies in plan.copies.items() for _ in range(copies)
    )
    crash_ids = set(plan.first_crash)
    assert not crash_ids & set(plan.poison)
    assert not crash_ids & plan.freeze


def test_tour_walks_through_every_line_of_the_report(safe_run: DemoRun) -> None:
    """docs/tour.md names every counter of the report with its requirement ID."""
    tour = (REPO_ROOT / "docs" / "tour.md").read_text("utf-8")
    readme = (REPO_ROOT / "README.md").read_text("utf-8")
    assert "docs/tour.md" in readme
    for layer in demo_report.LAYERS:
        assert f"`{layer.key}`" in tour, layer.key
        assert layer.label in tour, layer.label
        for requirement in layer.requirement.split(", "):
            assert requirement in tour, requirement
    report = safe_run.report
    for section in ("shop", "duplicates"):
        for key in report[section]:
            assert f"`{key}`" in tour, f"{section}.{key}"
    for key in report["faults"]["observed"]:
        assert f"`{key}`" in tour, f"faults.observed.{key}"
    for item in report["invariants"]:
        assert item["name"] in tour, item["name"]
