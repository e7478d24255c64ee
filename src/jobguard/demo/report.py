"""The demo's report, computed from the database file and the mail service's log alone.

Nothing here trusts a counter kept in memory during the run: the shop's tables say how many
invoices and stock cuts exist, the mail service's log says which emails went out, and jobguard's
own tables (``jobs``, ``attempts``, ``operations``) say what each layer caught. The report keeps
the raw numbers it was computed from, so a test can recompute every line from the same files.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jobguard.backends._sql import load_queries
from jobguard.demo import shop
from jobguard.demo.faults import FaultPlan
from jobguard.demo.settings import DemoFiles
from jobguard.demo.tasks import TASK_NAME

Q = load_queries("jobguard.demo", "report.sql")

EXIT_OK = 0
EXIT_INVARIANT_BROKEN = 1


@dataclass(frozen=True, slots=True)
class Layer:
    """One protection, the requirement it implements and the article section it comes from."""

    key: str
    label: str
    requirement: str
    article: str
    caught: str


LAYERS = (
    Layer(
        "dedup_hits",
        "dedup hits",
        "G6.1",
        "Deduplication key",
        "redeliveries folded into queued job",
    ),
    Layer(
        "already_processed",
        "already-processed skips",
        "G4.3",
        "Safe design, step 4",
        "done operations acked, not rerun",
    ),
    Layer(
        "memoised_steps",
        "memoised steps",
        "G5.1",
        "Order fulfillment: fixing the design",
        "done effects skipped on retry",
    ),
    Layer(
        "stale_leases_refused",
        "stale leases refused",
        "G2.4",
        "Visibility timeout",
        "expired leases reclaimed or refused",
    ),
    Layer(
        "stale_fences_refused",
        "stale fences refused",
        "G3.5",
        "Lock cache expiring too fast",
        "writes with an old fence refused",
    ),
    Layer(
        "lock_busy_deferrals",
        "lock-busy deferrals",
        "G3.4",
        "Locking worker",
        "order locked: requeued, uncharged",
    ),
    Layer("retries", "retries", "G7.2", "Safe retry", "transient errors retried (backoff)"),
    Layer(
        "poison_quarantined",
        "poison quarantined",
        "G8.1",
        "Poison job",
        "jobs moved to the DLQ, with reason",
    ),
    Layer(
        "email_replays",
        "email resends absorbed",
        "G4.4",
        "Idempotency to external APIs",
        "resends answered from their key",
    ),
    Layer(
        "slow_jobs_carried",
        "slow jobs carried",
        "G2.2, G3.3",
        "Visibility timeout, lock renewal",
        "outlived lease and lock, completed",
    ),
)


@dataclass(frozen=True, slots=True)
class RunInfo:
    """What the report needs to know about the run besides its files."""

    mode: str
    seed: int
    orders: int
    workers: int
    wall_time_s: float
    timed_out: bool


def _rows(conn: Any, name: str, **params: Any) -> list[dict[str, Any]]:
    return [dict(row) for row in conn.execute(Q[name], params).fetchall()]


def _by_key(conn: Any, name: str) -> dict[str, int]:
    return {row[0]: row[1] for row in conn.execute(Q[name]).fetchall()}


def is_poison(row: dict[str, Any]) -> bool:
    """Does this order carry data no retry can fix (see :meth:`shop.Order.validate`)?"""
    return bool(row["quantity"] < 1 or row["unknown_product"] or "@" not in row["email"])


def _mail(mail_log: dict[str, Any]) -> dict[str, Any]:
    requests: list[dict[str, Any]] = mail_log["requests"]
    sent: list[dict[str, Any]] = mail_log["sent"]
    faults = Counter(r["fault"] for r in requests if r["fault"])
    return {
        "requests": len(requests),
        "sent": len(sent),
        "faults": {kind: faults.get(kind, 0) for kind in ("error", "timeout", "drop")},
        # Sent, but the client never saw the answer: a retry cannot know the email went out.
        "ambiguous_sends": sum(
            1 for r in requests if r["applied"] and r["fault"] in ("timeout", "drop")
        ),
        "replays": sum(
            1 for r in requests if r["key"] and not r["applied"] and r["fault"] != "error"
        ),
        "sent_by_recipient": dict(Counter(str(s["to"]) for s in sent)),
    }


def _classify(orders: list[dict[str, Any]], emails: dict[str, int]) -> dict[str, Any]:
    fulfilled = in_dlq = lost = 0
    lost_orders: list[int] = []
    for row in orders:
        row["emails"] = emails.get(row["email"], 0) if row["email"] else 0
        done = row["invoices"] and row["stock_cuts"] and row["emails"] and row["jobs_completed"]
        if done:
            fulfilled += 1
        elif row["jobs_dead"] and not row["jobs_live"]:
            in_dlq += 1
        else:
            lost += 1
            lost_orders.append(row["id"])
    return {"fulfilled": fulfilled, "in_dlq": in_dlq, "lost": lost, "lost_orders": lost_orders[:20]}


def _extra(counts: list[int]) -> int:
    return sum(max(0, n - 1) for n in counts)


def build(files: DemoFiles, run: RunInfo) -> dict[str, Any]:
    """Compute the report of a finished run from ``files.db`` and ``files.mail_log``."""
    mail_log = json.loads(Path(files.mail_log).read_text("utf-8"))
    conn = shop.connect(files.db)
    try:
        orders = _rows(conn, "per_order", task=TASK_NAME)
        shelf = _rows(conn, "shelf")[0]
        outcomes = _by_key(conn, "attempt_outcomes")
        statuses = _by_key(conn, "jobs_by_status")
        counters = _rows(conn, "attempt_counters")[0]
        dedup = _rows(conn, "dedup_hits")[0]
        slow = _rows(conn, "slow_jobs_carried")[0]["n"]
        operations = _rows(conn, "completed_operations")[0]["n"]
        dead = _rows(conn, "dead_jobs")
        events = _by_key(conn, "events_by_kind")
        invoice_sources = _rows(conn, "invoice_sources")[0]
        stock_sources = _rows(conn, "stock_cut_sources")[0]
    finally:
        conn.close()
    mail = _mail(mail_log)
    classes = _classify(orders, mail["sent_by_recipient"])
    units_cut = sum(row["units_cut"] for row in orders)
    duplicates = {
        "invoices": _extra([row["invoices"] for row in orders]),
        "stock_cuts": _extra([row["stock_cuts"] for row in orders]),
        "emails": _extra(list(mail["sent_by_recipient"].values())),
    }
    duplicates["total"] = sum(duplicates.values())
    layers = {
        "dedup_hits": dedup["hits"],
        "already_processed": outcomes.get("already_processed", 0),
        "memoised_steps": counters["steps_skipped"],
        "stale_leases_refused": outcomes.get("lost", 0) + outcomes.get("lease_refused", 0),
        "stale_fences_refused": outcomes.get("fence_refused", 0),
        "lock_busy_deferrals": outcomes.get("deferred", 0),
        "retries": outcomes.get("retry", 0),
        "poison_quarantined": statuses.get("dead", 0),
        "email_replays": mail["replays"],
        "slow_jobs_carried": slow,
    }
    poison = [row for row in orders if is_poison(row)]
    dead_by_order = {job["order_id"]: job for job in dead}
    report: dict[str, Any] = {
        "mode": run.mode,
        "seed": run.seed,
        "orders": run.orders,
        "workers": run.workers,
        "wall_time_s": round(run.wall_time_s, 2),
        "timed_out": run.timed_out,
        "files": {
            "db": str(files.db),
            "mail_log": str(files.mail_log),
            "workers_log": str(files.workers_log),
        },
        "shop": {
            "orders": len(orders),
            "fulfilled": classes["fulfilled"],
            "in_dlq": classes["in_dlq"],
            "lost": classes["lost"],
            "invoices": sum(row["invoices"] for row in orders),
            "stock_cuts": sum(row["stock_cuts"] for row in orders),
            "stock_units_cut": units_cut,
            "emails_sent": mail["sent"],
            "mail_requests": mail["requests"],
        },
        "duplicates": duplicates,
        "lost": classes["lost"],
        "lost_orders": classes["lost_orders"],
        "layers": {
            layer.key: {
                "count": layers[layer.key],
                "requirement": layer.requirement,
                "article": layer.article,
                "caught": layer.caught,
            }
            for layer in LAYERS
        },
        "layer_parts": {
            "leases_expired_and_taken_over": outcomes.get("lost", 0),
            "late_writes_refused": outcomes.get("lease_refused", 0),
            "deferred_lock_busy": counters["lock_busy"],
            "deferred_operation_in_progress": counters["operation_busy"],
        },
        "faults": {
            "planned": FaultPlan.build(run.seed, run.orders).summary(),
            "observed": {
                "webhook_deliveries": dedup["jobs"] + dedup["hits"],
                "workers_killed": events.get("worker_killed", 0),
                "workers_exited_otherwise": events.get("worker_exited", 0),
                "workers_frozen": events.get("worker_frozen", 0),
                "locks_taken_over_while_frozen": events.get("lock_taken_over", 0),
                "back_office_holds": events.get("back_office_hold", 0),
                "late_redeliveries": events.get("late_redelivery", 0),
                "poison_orders": len(poison),
                "mail_faults": mail["faults"],
                "mail_ambiguous_sends": mail["ambiguous_sends"],
            },
        },
        "dlq": [
            {"job_id": job["id"], "order_id": job["order_id"], "reason": job["dead_reason"]}
            for job in dead
        ],
        "symptoms": _symptoms(orders, duplicates, invoice_sources, stock_sources, mail, outcomes),
        "raw": {
            "jobs_by_status": statuses,
            "attempt_outcomes": outcomes,
            "attempts": counters["attempts"],
            "steps_run": counters["steps_run"],
            "completed_operations": operations,
            "units_missing_from_shelves": shelf["units_missing"],
            "events": events,
            "sent_by_recipient": mail["sent_by_recipient"],
        },
    }
    report["invariants"] = _invariants(report, orders, poison, dead_by_order, shelf, run)
    report["ok"] = all(item["ok"] for item in report["invariants"])
    report["exit_code"] = EXIT_OK if report["ok"] else EXIT_INVARIANT_BROKEN
    return report


def _symptoms(
    orders: list[dict[str, Any]],
    duplicates: dict[str, int],
    invoice_sources: dict[str, int],
    stock_sources: dict[str, int],
    mail: dict[str, Any],
    outcomes: dict[str, int],
) -> list[dict[str, Any]]:
    """The article's symptoms with counts, their causes, and the layer that prevents each."""
    return [
        {
            "symptom": "double invoices",
            "count": duplicates["invoices"],
            "orders": sum(1 for row in orders if row["invoices"] > 1),
            "from_duplicate_jobs": invoice_sources["from_duplicate_jobs"],
            "from_redeliveries": invoice_sources["from_redeliveries"],
            "caught_by": "UNIQUE(order_id) (G4.5), the create-invoice db_step (G5.1), the "
            "operation record (G4.2, G4.3); duplicate triggers by the dedup key (G6)",
        },
        {
            "symptom": "stock cut twice",
            "count": duplicates["stock_cuts"],
            "orders": sum(1 for row in orders if row["stock_cuts"] > 1),
            "from_duplicate_jobs": stock_sources["from_duplicate_jobs"],
            "from_redeliveries": stock_sources["from_redeliveries"],
            "caught_by": "the cut-stock db_step, committed with its step record (G5.1, G4.5), "
            "the operation record (G4.3); duplicate triggers by the dedup key (G6)",
        },
        {
            "symptom": "double emails",
            "count": duplicates["emails"],
            "orders": sum(1 for n in mail["sent_by_recipient"].values() if n > 1),
            "ambiguous_sends": mail["ambiguous_sends"],
            "caught_by": "the Idempotency-Key from ctx.idempotency_key('email') (G4.4), the "
            "send-email step (G5.1), the operation record (G4.3)",
        },
        {
            "symptom": "a job taken over while its first worker still ran",
            "count": outcomes.get("lease_refused", 0),
            "caught_by": "heartbeat lease extension (G2.2) and lock renewal (G3.3); the store "
            "refusing the stale worker's writes (G2.4, G3.5)",
        },
    ]


def _invariants(
    report: dict[str, Any],
    orders: list[dict[str, Any]],
    poison: list[dict[str, Any]],
    dead_by_order: dict[int, dict[str, Any]],
    shelf: dict[str, int],
    run: RunInfo,
) -> list[dict[str, Any]]:
    dup = report["duplicates"]
    wrong_cuts = sum(row["wrong_cuts"] for row in orders)
    ledger = report["shop"]["stock_units_cut"]
    bad_poison = [
        row["id"]
        for row in poison
        if row["invoices"]
        or row["stock_cuts"]
        or row["emails"]
        or "ValidationError" not in str((dead_by_order.get(row["id"]) or {}).get("dead_reason"))
    ]
    live_jobs = report["raw"]["jobs_by_status"].get("queued", 0) + report["raw"][
        "jobs_by_status"
    ].get("running", 0)
    return [
        {
            "name": "no double invoice",
            "ok": dup["invoices"] == 0,
            "detail": f"{dup['invoices']} extra invoices",
        },
        {
            "name": "no double stock cut",
            "ok": dup["stock_cuts"] == 0 and wrong_cuts == 0 and ledger == shelf["units_missing"],
            "detail": f"{dup['stock_cuts']} extra cuts, {wrong_cuts} wrong; ledger {ledger} units, "
            f"shelves {shelf['units_missing']} units short",
        },
        {
            "name": "no double email",
            "ok": dup["emails"] == 0,
            "detail": f"{dup['emails']} extra emails",
        },
        {
            "name": "nothing lost",
            "ok": report["lost"] == 0 and live_jobs == 0 and not run.timed_out,
            "detail": f"{report['lost']} orders unaccounted for, {live_jobs} jobs left"
            f"{', the run timed out' if run.timed_out else ''}",
        },
        {
            "name": "poison orders quarantined",
            "ok": not bad_poison,
            "detail": f"{len(poison)} poison orders"
            + (f"; not cleanly in the DLQ: {bad_poison}" if bad_poison else ", all in the DLQ"),
        },
    ]
