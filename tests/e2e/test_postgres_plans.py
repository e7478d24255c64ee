"""PostgreSQL plans every statement of a delivery's path by key, however long the queue's history.

A statement that reads its rows by primary key stays as cheap with a million finished jobs as
with ten; one planned as a scan of a whole table costs more with every job ever run. The
planner's guesses decide which, and they can surprise: it takes every list of items passed as
jsonb for 100 rows, and once planned an ``EXISTS`` over ``operations`` in the settle statement
as a hash of the whole table (a scan per batch). So this test gives a store a history of
finished jobs (their operations, attempts, locks and steps), runs real deliveries through a
worker, asks PostgreSQL how it plans each statement of their path with the very parameters the
worker sent (``EXPLAIN``, which runs nothing), and fails on a scan of a history table.

A worker's connection keeps a statement's plan once it has run it a few times (a prepared
statement's generic plan, made without its parameters' values), so the plan made while the
tables are still small, as on a new store, is the one its statements keep running with as the
history grows (until an ANALYZE replans them). The last test asks for those plans.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.types.json import Jsonb

from jobguard import App, Context
from jobguard.backends.postgres.driver import PostgresTx, bound, render_queries
from jobguard.models import JobStatus
from jobguard.worker import Worker
from tests.support import pg

HISTORY = 5000
JOBS = 12
# The statements a full-guard delivery runs: fetch and begin (in one statement, or, for a batch
# with an operation recorded already, in several), step, settle.
PATH = frozenset({
    "lease_and_begin", "begin_batch",
    "guard_state", "insert_step_or_fail", "settle_set",
})  # fmt: skip
HISTORY_TABLES = ("jobs", "attempts", "operations", "locks", "slots", "steps")
SCAN = re.compile(r"Seq Scan on (\w+)")
PARAM = re.compile(r"%\((\w+)\)s")
# The other statements that take a list of items, each with items naming history rows.
ITEMS_OFF_PATH: dict[str, list[dict[str, Any]]] = {
    "extend_leases": [{"job_id": n, "lease_token": "t", "visibility_timeout_s": 3} for n in (1, 2)],
    # A batch's begin one statement at a time (one asking for a slot, or two for one resource).
    "grant_locks": [{"resource": f"old-res:{n}", "owner": "o", "expires_at": 9} for n in (1, 2)],
    "insert_operations": [
        {"key": f"old-op:{n}", "resource_key": None, "owner_lease": "t", "fence": 1} for n in (1, 2)
    ],
    "insert_attempts": [{"job_id": n, "lock_owner": "o", "fence": 2} for n in (1, 2)],
    "renew_locks": [{"resource": f"old-res:{n}", "owner": "o", "ttl_s": 3} for n in (1, 2)],
    "release_locks": [{"resource": f"old-res:{n}", "owner": "o"} for n in (1, 2)],
    "renew_slots": [{"key": f"old-slot:{n}", "slot": 0, "owner": "o", "ttl_s": 3} for n in (1, 2)],
    "release_slots": [{"key": f"old-slot:{n}", "slot": 0, "owner": "o"} for n in (1, 2)],
    "mark_attempts": [{"attempt_id": n, "outcome": "refused"} for n in (1, 2)],
    "attempt_locks": [{"attempt_id": n, "lock_owner": "o", "fence": 2} for n in (1, 2)],
}


@pytest.fixture
def store_url() -> str:
    """A fresh store of its own, in the session's database."""
    return pg.fresh_store_url(pg.session_database())


def give_history(url: str, count: int) -> None:
    """``count`` finished jobs with their operation, attempt, lock, slot and step, then ANALYZE
    (what autovacuum would have done by then)."""
    database, _, schema = url.partition("?schema=")
    with psycopg.connect(database, autocommit=True) as conn:
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        conn.execute(
            "INSERT INTO jobs (task, queue, payload, status, run_at, max_attempts,"
            " visibility_timeout_s, created_at, finished_at, attempts)"
            " SELECT 'old', 'old', '{}', 'completed', 0, 5, 30, 0, 1, 1"
            " FROM generate_series(1, %(n)s)",
            {"n": count},
        )
        conn.execute(
            "INSERT INTO operations (key, status, created_at, updated_at, completed_at)"
            " SELECT 'old-op:' || id, 'completed', 0, 1, 1 FROM jobs"
        )
        conn.execute(
            "INSERT INTO attempts (job_id, attempt, task, queue, operation_key, worker_id,"
            " lease_token, started_at, ended_at, outcome)"
            " SELECT id, 1, 'old', 'old', 'old-op:' || id, 'old-worker', 'old-lease:' || id,"
            " 0, 1, 'completed' FROM jobs"
        )
        conn.execute("INSERT INTO locks (resource, fence) SELECT 'old-res:' || id, 1 FROM jobs")
        conn.execute(
            "INSERT INTO slots (key, slot, fence) SELECT 'old-slot:' || id, 0, 1 FROM jobs"
        )
        conn.execute(
            "INSERT INTO steps (operation_key, name, result, created_at)"
            " SELECT key, 'effect', 'null', 1 FROM operations"
        )
        for table in HISTORY_TABLES:
            conn.execute(sql.SQL("ANALYZE {}").format(sql.Identifier(table)))


def scans_of(plans: Mapping[str, list[str]]) -> set[tuple[str, str]]:
    """(statement, history table) for each scan of a whole history table in ``plans``."""
    return {
        (name, table)
        for name, texts in plans.items()
        for text in texts
        for table in SCAN.findall(text)
        if table in HISTORY_TABLES
    }


def record_plans(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[str]]:
    """Each statement of :data:`PATH` is explained, with the parameters it is run with, just
    before it runs; the plans by statement name."""
    plans: dict[str, list[str]] = {}
    execute, with_commit = PostgresTx._execute, PostgresTx.run_with_commit

    def explain(tx: PostgresTx, name: str, params: Mapping[str, Any]) -> None:
        if name in PATH:
            text = f"EXPLAIN {tx._statements[name].text}"
            rows = tx.connection.execute(text, bound(params)).fetchall()
            plans.setdefault(name, []).append("\n".join(row[0] for row in rows))

    def explained(tx: PostgresTx, name: str, params: Mapping[str, Any]) -> Any:
        explain(tx, name, params)
        return execute(tx, name, params)

    def explained_with_commit(tx: PostgresTx, name: str, params: Mapping[str, Any]) -> None:
        explain(tx, name, {"now": None, **params})
        with_commit(tx, name, params)

    monkeypatch.setattr(PostgresTx, "_execute", explained)
    monkeypatch.setattr(PostgresTx, "run_with_commit", explained_with_commit)
    return plans


def test_a_delivery_path_reads_its_rows_by_key_beside_a_long_history(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    give_history(store_url, HISTORY)
    app = App(store_url)

    def insert_effect(conn: Any, n: int) -> int:
        conn.execute("SELECT %s::integer", (n,))
        return n

    @app.task(name="fulfil", operation_key="fulfil:{n}", resource_key="order:{n}")
    def fulfil(ctx: Context, n: int) -> None:
        ctx.db_step("effect", insert_effect, n)

    @app.task(name="replay", operation_key="old-op:{n}")
    def replay(ctx: Context, n: int) -> None:
        raise AssertionError("its operation completed in the history: it must not run")

    try:
        # First in the queue, so the first batch takes the path of several statements.
        jobs = replay.enqueue_many({"n": n} for n in (1, 2))
        jobs += fulfil.enqueue_many({"n": n} for n in range(JOBS))
        plans = record_plans(monkeypatch)
        worker = Worker(app, concurrency=2, install_signal_handlers=False)
        worker.run(burst=True)
        monkeypatch.undo()
        assert {app.get_job(job.id).status for job in jobs} == {JobStatus.COMPLETED}
    finally:
        app.close()

    assert set(plans) == PATH  # every statement of the path was seen
    assert scans_of(plans) == set(), described(plans)


def test_the_heartbeat_and_the_other_item_statements_read_their_rows_by_key(
    store_url: str,
) -> None:
    give_history(store_url, HISTORY)
    database, _, schema = store_url.partition("?schema=")
    queries = render_queries(schema)
    plans: dict[str, list[str]] = {}
    with psycopg.connect(database, autocommit=True) as conn:
        off_path: dict[str, dict[str, Any]] = {
            name: {"items": Jsonb(items)} for name, items in ITEMS_OFF_PATH.items()
        }
        # Off the path too since a fetch leases queued jobs as it picks them: expired leases.
        off_path["lease_jobs"] = {"ids": [1, 2], "worker_id": "w"}
        for name, given in off_path.items():
            params: dict[str, Any] = dict.fromkeys(PARAM.findall(queries[name]))
            params.update(given, now=1.0)
            rows = conn.execute(f"EXPLAIN {queries[name]}", params).fetchall()
            plans[name] = ["\n".join(row[0] for row in rows)]
    assert scans_of(plans) == set(), described(plans)


def described(plans: Mapping[str, list[str]]) -> str:
    """Every plan, under its statement's name (what a failure shows)."""
    return "\n\n".join(f"{name}:\n{text}" for name, texts in plans.items() for text in texts)


def generic_plan(conn: psycopg.Connection[Any], query: str) -> str:
    """How ``query`` is planned without its parameters' values, as a prepared statement's
    cached plan is (``%(name)s`` placeholders as ``$n``)."""
    names: dict[str, int] = {}
    numbered = PARAM.sub(lambda m: f"${names.setdefault(m.group(1), len(names) + 1)}", query)
    conn.execute("SET plan_cache_mode = force_generic_plan")
    conn.execute(f"PREPARE planned AS {numbered}")
    try:
        nulls = ", ".join(["NULL"] * len(names))
        rows = conn.execute(
            f"EXPLAIN EXECUTE planned({nulls})" if names else "EXPLAIN EXECUTE planned"
        )
        return "\n".join(row[0] for row in rows.fetchall())
    finally:
        conn.execute("DEALLOCATE planned")


# Statements still planned, on a new store, as a scan of a history table, none of them on the
# path of a batch of new jobs: begun in the fetch's transaction (a retry, an expired lease), or
# marking refused attempts. Reading each item's row on its own, or planning them anew on every
# run, was tried: a drain with a third of the jobs retried ran slower at 2x16
# (bench/results/fetch-plans-ab-2026-12-04.txt, the 20,000-job runs).
SCANNING_ON_A_NEW_STORE = frozenset({
    "begin_batch", "insert_attempts", "lease_jobs", "mark_attempts", "attempt_locks",
})  # fmt: skip


def test_plans_made_on_a_new_store_read_their_rows_by_key(store_url: str) -> None:
    """No history and no ANALYZE: the tables are as small as they will ever be, the planner's
    case for scanning one whole is at its strongest, and the plan it makes is kept."""
    database, _, schema = store_url.partition("?schema=")
    queries = render_queries(schema)
    with psycopg.connect(database, autocommit=True) as conn:
        plans = {
            name: [generic_plan(conn, queries[name])]
            for name in sorted(PATH | set(ITEMS_OFF_PATH) | {"lease_jobs"})
        }
    scanning = {name for name, _ in scans_of(plans)}
    assert scanning == SCANNING_ON_A_NEW_STORE, described(
        {name: plans[name] for name in scanning - SCANNING_ON_A_NEW_STORE}
    )


def test_a_lease_token_stays_one_jobs_and_its_index_holds_only_leases_held(store_url: str) -> None:
    """The lease token's index holds only jobs that hold a lease (each of a job's writes adds an
    entry to every index whose condition the row meets, so queued and finished jobs are left
    out), yet two jobs still cannot hold one token, and the claim's liveness check finds a token
    by the index in the plan it keeps for any token."""
    app = App(store_url)
    try:

        @app.task(name="held", operation_key="held:{n}")
        def held(ctx: Context, n: int) -> None:
            pass

        done = held.enqueue(n=0)
        Worker(app, concurrency=1, install_signal_handlers=False).run(burst=True)
        assert app.get_job(done.id).status is JobStatus.COMPLETED
        queued = [held.enqueue(n=n) for n in (1, 2)]
    finally:
        app.close()
    database, _, schema = store_url.partition("?schema=")
    jobs = sql.Identifier(schema, "jobs")
    with psycopg.connect(database, autocommit=True) as conn:
        take = sql.SQL("UPDATE {} SET lease_token = 'a' WHERE id = %s").format(jobs)
        conn.execute(take, (queued[0].id,))
        with pytest.raises(psycopg.errors.UniqueViolation):
            conn.execute(take, (queued[1].id,))
        holding = conn.execute(
            sql.SQL("SELECT count(*) FROM {} WHERE lease_token IS NOT NULL").format(jobs)
        ).fetchone()
        assert holding == (1,)  # the finished job and the other queued one hold none
        # What the index holds, as PostgreSQL keeps it: only rows with a token.
        kept = conn.execute(
            "SELECT indisunique, pg_get_expr(indpred, indrelid) FROM pg_index"
            " WHERE indexrelid = to_regclass(%s)",
            [sql.Identifier(schema, "jobs_lease_token").as_string(conn)],
        ).fetchone()
        assert kept == (True, "(lease_token IS NOT NULL)")
        plan = generic_plan(conn, render_queries(schema)["lease_holder_alive"])
    assert "Index Scan using jobs_lease_token" in plan.splitlines()[0], plan


def test_settling_a_batch_proves_each_item_once_not_once_per_job_row_of_the_batch(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one-statement settle of N successes reads each item's lock and operation row once:
    N primary-key reads of each, where a proof filtered inside the join of jobs and items ran
    N x N of them (40 items: 1,600 reads per table, at a cost that grows with the square of the
    batch). Counted by PostgreSQL itself (``EXPLAIN ANALYZE``, rolled back) just before the real
    statement runs."""
    app = App(store_url)
    items = 40

    @app.task(name="fulfil", operation_key="fulfil:{n}", resource_key="order:{n}")
    def fulfil(ctx: Context, n: int) -> None:
        pass

    loops: dict[str, int] = {}
    execute = PostgresTx._execute

    def counted(tx: PostgresTx, name: str, params: Mapping[str, Any]) -> Any:
        if name == "settle_set" and len(params["items"]) == items:
            conn = tx.connection
            assert isinstance(conn, psycopg.Connection)
            with conn.transaction(force_rollback=True):
                text = f"EXPLAIN (ANALYZE, FORMAT JSON) {tx._statements[name].text}"
                [[plan]] = conn.execute(text, bound(params)).fetchall()
            for node in nodes_of(plan[0]["Plan"]):
                table = node.get("Relation Name")
                if node["Node Type"] == "Index Scan" and table in ("locks", "operations"):
                    loops[table] = loops.get(table, 0) + node["Actual Loops"]
        return execute(tx, name, params)

    try:
        jobs = fulfil.enqueue_many({"n": n} for n in range(items))
        backend = app.backend
        rules = {name: task.delivery_rules() for name, task in app.tasks.items()}
        fetched = backend.fetch_prepared(["default"], items, "w", rules)
        assert len(fetched) == items
        monkeypatch.setattr(PostgresTx, "_execute", counted)
        worker = Worker(app, concurrency=1, install_signal_handlers=False)
        pipeline = worker._pipeline
        endings = [pipeline.run(pipeline.adopt(prepared)) for prepared in fetched]
        assert backend.settle(endings) == [None] * items
        monkeypatch.undo()
        assert {app.get_job(job.id).status for job in jobs} == {JobStatus.COMPLETED}
    finally:
        app.close()
    # Each table: one proof read per item, and one more per item where the row is written.
    assert loops == {"locks": 2 * items, "operations": 2 * items}


def nodes_of(node: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """A plan node and every node under it (sub-plans and CTEs included)."""
    found = [node]
    for child in node.get("Plans", []):
        found += nodes_of(child)
    return found
