"""The article's order fulfilment as a plain task of a host queue, and how to judge a run.

One order's work: cut its stock, wait (the warehouse call), write its invoice, both rows in the
store's own database. Every run of the handler writes a ``start`` and an ``end`` line to the
run's event log (one JSON object per line, appended by every worker process), so overlapping
executions are read from the handlers' own log, and the test's SIGKILLs are logged there too.

Everything a worker process needs comes from environment variables set by the test
(:func:`worker_env`), so the same module serves Celery, RQ and Dramatiq workers.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support import stores

SLOW_S = 5.0  # longer than the hosts' visibility timeout in these tests
QUICK_S = 0.05

TASK = "orders.fulfil"
# The guard's options of the order task on every host. Short leases and locks, so that a
# SIGKILLed delivery is taken over within the test; kills cost an attempt each.
GUARDED: dict[str, Any] = {
    "name": TASK,
    "operation_key": "fulfil-order:{order_id}",
    "resource_key": "order:{order_id}",
    "visibility_timeout_s": 3,
    "lock_ttl_s": 3,
    "max_attempts": 8,
}

FRAGILE = "orders.fragile"

LIMITED = "orders.limited"
# The guard's options of a task whose runs share one warehouse dock: at most one at a time,
# however many host workers take its messages.
GUARDED_LIMITED: dict[str, Any] = {
    "name": LIMITED,
    "operation_key": "limited-order:{order_id}",
    "concurrency_key": "warehouse-dock",
    "concurrency_limit": 1,
    "visibility_timeout_s": 3,
    "lock_ttl_s": 3,
}
DOCK_S = 0.5  # how long one order holds the dock


def guarded_fragile() -> dict[str, Any]:
    """The guard's options of a task that fails fatally until the warehouse is fixed (a marker
    file beside the event log), deduplicated at the producer. Its reservation waits
    ``HOSTQ_UNSENT_S`` (300 s unless the test says) for a first delivery, read when a tasks
    module is made, so a test of a producer killed before sending can shorten it."""
    return {
        "name": FRAGILE,
        "operation_key": "fragile-order:{order_id}",
        "dedup": True,
        "visibility_timeout_s": 3,
        "dedup_unsent_s": float(os.environ.get("HOSTQ_UNSENT_S", "300")),
    }


CUTS = "stock_cuts"
INVOICES = "invoices"


@dataclass(frozen=True)
class Plan:
    """Which orders are sent, how often each, and which are slow."""

    orders: int
    slow_every: int
    seed: int = 19
    sends: list[int] = field(default_factory=list)

    @classmethod
    def make(cls, orders: int, slow_every: int, seed: int = 19) -> Plan:
        rng = random.Random(seed)
        sends = [order for order in range(1, orders + 1) for _ in range(rng.randint(1, 3))]
        rng.shuffle(sends)
        return cls(orders, slow_every, seed, sends)

    def work_s(self, order_id: int) -> float:
        """How long the warehouse call of ``order_id`` takes."""
        return SLOW_S if order_id % self.slow_every == 0 else QUICK_S


def size() -> tuple[Plan, int]:
    """The suite's workload: 20 orders, two of them slow, and 3 SIGKILLs, so that every host's
    runs stay short; ``TEST_HOST_ORDERS`` and ``TEST_HOST_KILLS`` ask for a larger one (the
    issue's is 300 and 10), with one slow order in ten."""
    orders = int(os.environ.get("TEST_HOST_ORDERS", "20"))
    kills = int(os.environ.get("TEST_HOST_KILLS", "3"))
    return Plan.make(orders=orders, slow_every=10), kills


def run_bound_s(plan: Plan) -> float:
    """How long a run may take before it is judged unfinished (the issue's size needs more
    than the suite's)."""
    return 120.0 + 2.0 * plan.orders


def case_timeout_s(plan: Plan) -> float:
    """The pytest timeout of a run's test: the run's bound, and its start and judging."""
    return run_bound_s(plan) + 120.0


def plain_stores() -> list[str]:
    """The stores the plain runs use: SQLite in the suite (the plain host's duplicates do not
    depend on the store), both when a larger workload is asked for."""
    return ["sqlite", "postgres"] if "TEST_HOST_ORDERS" in os.environ else ["sqlite"]


def worker_env(store_url: str, log: Path, broker_url: str, slow_every: int) -> dict[str, str]:
    """What a worker process of the run reads (see the module docstring)."""
    from tests.support.procs import clean_env

    return {
        **clean_env(),
        "HOSTQ_STORE": store_url,
        "HOSTQ_LOG": str(log),
        "HOSTQ_BROKER": broker_url,
        "HOSTQ_SLOW_EVERY": str(slow_every),
        "PYTHONUNBUFFERED": "1",
    }


def create_tables(store_url: str) -> None:
    """The business tables, beside the store (its file, or its schema)."""
    stores.execute(
        store_url,
        [
            f"CREATE TABLE {stores.table(store_url, CUTS)} (order_id INTEGER, pid INTEGER)",
            f"CREATE TABLE {stores.table(store_url, INVOICES)} (order_id INTEGER, pid INTEGER)",
        ],
    )


def _placeholder(conn: Any) -> str:
    return "?" if stores.kind_of(os.environ["HOSTQ_STORE"]) == "sqlite" else "%s"


def cut_stock(conn: Any, order_id: int) -> int:
    """The first effect: one stock movement for the order (a duplicate is a second row)."""
    table = stores.table(os.environ["HOSTQ_STORE"], CUTS)
    mark = _placeholder(conn)
    conn.execute(
        f"INSERT INTO {table} (order_id, pid) VALUES ({mark}, {mark})", (order_id, os.getpid())
    )
    return order_id


def write_invoice(conn: Any, order_id: int) -> int:
    """The second effect: the order's invoice."""
    table = stores.table(os.environ["HOSTQ_STORE"], INVOICES)
    mark = _placeholder(conn)
    conn.execute(
        f"INSERT INTO {table} (order_id, pid) VALUES ({mark}, {mark})", (order_id, os.getpid())
    )
    return order_id


def log_event(kind: str, order_id: int, **extra: Any) -> None:
    """Append one line to the run's event log (atomic for lines this short)."""
    line = json.dumps(
        {"kind": kind, "order": order_id, "pid": os.getpid(), "t": time.time(), **extra}
    )
    with open(os.environ["HOSTQ_LOG"], "a", encoding="utf-8") as log:
        log.write(line + "\n")


@contextmanager
def handler_run(order_id: int) -> Iterator[None]:
    """Log the start and the end of one execution of the handler; a run that raised ended
    too (RQ runs each job in a work-horse of its own, which exits after it), and its line names
    what it raised."""
    log_event("start", order_id)
    raised: str | None = None
    try:
        yield
    except BaseException as exc:
        raised = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        log_event("end", order_id, raised=raised)


def work_s(order_id: int) -> float:
    """How long the warehouse call takes, in a worker process."""
    return SLOW_S if order_id % int(os.environ["HOSTQ_SLOW_EVERY"]) == 0 else QUICK_S


def fulfil_plain(order_id: int) -> None:
    """The task a user has today: two writes and a slow call between them, no guard."""
    with handler_run(order_id):
        conn = stores.connect(os.environ["HOSTQ_STORE"])
        try:
            cut_stock(conn, order_id)
            time.sleep(work_s(order_id))
            write_invoice(conn, order_id)
        finally:
            conn.close()


def fulfil_guarded(ctx: Any, order_id: int) -> None:
    """The same task guarded: each write is a ``ctx.db_step`` in the store's database."""
    with handler_run(order_id):
        ctx.db_step("cut-stock", cut_stock, order_id)
        time.sleep(work_s(order_id))
        ctx.db_step("invoice", write_invoice, order_id)


def fulfil_limited(ctx: Any, order_id: int) -> None:
    """Cut stock at the dock, which takes a while; one order at a time may use it."""
    with handler_run(order_id):
        ctx.db_step("cut-stock", cut_stock, order_id)
        time.sleep(DOCK_S)


def warehouse_fixed() -> Path:
    """The marker that makes :func:`fulfil_fragile` succeed."""
    return Path(os.environ["HOSTQ_LOG"] + ".fixed")


def fulfil_fragile(ctx: Any, order_id: int) -> None:
    """Cut stock, then fail for good until the warehouse is fixed."""
    ctx.db_step("cut-stock", cut_stock, order_id)
    if not warehouse_fixed().exists():
        from jobguard import Fatal

        raise Fatal("the warehouse refuses the order")
    ctx.db_step("invoice", write_invoice, order_id)


# -- judging a run ------------------------------------------------------------------------------


def events(log: Path) -> list[dict[str, Any]]:
    """Every line of the event log, in the order written."""
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines() if line]


def running_pids(log: Path) -> list[int]:
    """Processes that started a run and have neither ended it nor been killed."""
    open_runs: dict[int, int] = {}
    for event in events(log):
        if event["kind"] == "start":
            open_runs[event["pid"]] = event["order"]
        elif event["kind"] in ("end", "kill"):
            open_runs.pop(event["pid"], None)
    return list(open_runs)


@dataclass(frozen=True)
class Run:
    """One execution of the handler, from the event log."""

    order: int
    pid: int
    started: float
    ended: float
    how: str  # "ended", "raised <what>", "killed", or "running" (neither, when judged)


def handler_runs(log: Path) -> list[Run]:
    """Every execution: a run lasts from its start to its end or its kill."""
    runs: list[Run] = []
    open_runs: dict[int, tuple[int, float]] = {}
    for event in events(log):
        pid = event["pid"] if event["kind"] != "kill" else event["victim"]
        if event["kind"] == "start":
            open_runs[pid] = (event["order"], event["t"])
        elif event["kind"] in ("end", "kill") and pid in open_runs:
            order, started = open_runs.pop(pid)
            raised = event.get("raised")
            how = "killed" if event["kind"] == "kill" else f"raised {raised}" if raised else "ended"
            runs.append(Run(order, pid, started, event["t"], how))
    now = time.time()
    runs += [Run(order, pid, at, now, "running") for pid, (order, at) in open_runs.items()]
    return runs


def overlapping_orders(log: Path) -> dict[int, list[Run]]:
    """Orders with two executions at once, each with all its runs (what a failure shows)."""
    by_order: dict[int, list[Run]] = {}
    for run in handler_runs(log):
        by_order.setdefault(run.order, []).append(run)
    overlapping: dict[int, list[Run]] = {}
    for order, runs in by_order.items():
        runs.sort(key=lambda run: run.started)
        latest_end = float("-inf")
        for run in runs:
            if run.started < latest_end:
                overlapping[order] = runs
            latest_end = max(latest_end, run.ended)
    return overlapping


def effect_counts(store_url: str, table: str) -> Counter[int]:
    """How many rows each order has in ``table``."""
    found = stores.query(store_url, f"SELECT order_id FROM {stores.table(store_url, table)}")
    return Counter(order for (order,) in found)


def duplicated_orders(store_url: str) -> set[int]:
    """Orders whose stock was cut, or invoice written, more than once."""
    doubled = {o for o, n in effect_counts(store_url, CUTS).items() if n > 1}
    return doubled | {o for o, n in effect_counts(store_url, INVOICES).items() if n > 1}


def killed(log: Path) -> int:
    """How many SIGKILLs the test sent."""
    return sum(1 for event in events(log) if event["kind"] == "kill")


def settled_orders(store_url: str, task: str) -> dict[int, set[str]]:
    """Per order, the states of its shadow jobs in the store."""
    found = stores.query(
        store_url,
        f"SELECT operation_key, status FROM {stores.table(store_url, 'jobs')} WHERE task = ?",
        (task,),
    )
    states: dict[int, set[str]] = {}
    for key, status in found:
        states.setdefault(int(key.rsplit(":", 1)[1]), set()).add(status)
    return states


def every_order_settled(store_url: str, task: str, orders: int) -> bool:
    """Every order has a completed or dead shadow job, and none is queued or running."""
    states = settled_orders(store_url, task)
    return len(states) == orders and all(
        s & {"completed", "dead"} and not s & {"queued", "running"} for s in states.values()
    )


def dead_orders(store_url: str, task: str) -> set[int]:
    """Orders whose shadow job is in the dead letter queue (and none completed)."""
    return {
        order
        for order, states in settled_orders(store_url, task).items()
        if "dead" in states and "completed" not in states
    }
