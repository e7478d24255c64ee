"""Round trips to PostgreSQL per job: which statements a job costs, counted in one worker.

Usage (from the repository root, after ``pip install -e '.[postgres,bench]'``)::

    python -m bench.round_trips                 # 600 full-guard jobs, 4 threads
    python -m bench.round_trips --job plain --jobs 2000 --concurrency 16
    python -m bench.round_trips --job writes --held 2000      # beside another worker's jobs
    python -m bench.round_trips --job writes --analyze locks  # statistics of an empty table

A worker runs in this process (``Worker.run(burst=True)``) over a prefilled queue in a
throw-away database; every statement psycopg sends is counted by name (jobguard's named
statements, the task's own insert, and BEGIN/COMMIT/ROLLBACK/SAVEPOINT/RELEASE of the transactions).
Outside psycopg's pipeline mode each is one round trip to the server; inside it, statements
travel together and the client waits only where it needs an answer, so "round trips" counts
those waits (a sync or a fetch with results outstanding) and "statements" what was sent.
Round trips, rows written and CPU, not time, are what this measures: they set the cost per job
for the worker and for the server, and so the throughput on a small machine, and do not depend
on what else the machine runs. Rows written are the store tables' inserted, updated and deleted
rows (``pg_stat_user_tables``), with the share of updates that wrote no index entry
(heap-only); the write-ahead log per job is the server's log position before the enqueue and
after the drain, and the pages read those of the store's tables and indexes
(``pg_statio_user_tables``): counts that do not drift with the machine's load, as CPU per job
does. Server CPU is that of the worker's own server processes (``/proc``, so the server must
run on this host). The server's ``autovacuum`` setting is printed: the bench machine runs with
it off (see docs/operations.md).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any
from unittest.mock import patch

import psycopg
from psycopg import _pipeline_base, sql

from bench.measure import load
from bench.pgdb import scratch_database
from bench.procs import cpu_seconds
from bench.stores import BenchStore
from jobguard.backends.postgres.driver import render_queries
from jobguard.backends.postgres.onetrip import OneTrip
from jobguard.backends.postgres.statements import native_statements
from jobguard.worker import Worker


def statement_names(schema: str) -> dict[str | bytes, str]:
    """jobguard's statement names by what psycopg is given to run: the text, or the native form
    the driver sends (:mod:`jobguard.backends.postgres.statements`)."""
    names: dict[str | bytes, str] = {}
    for name, statement in native_statements(render_queries(schema)).items():
        names[statement.text] = names[statement.native] = name
    return names


def statement_name(names: dict[str | bytes, str], text: str | bytes) -> str:
    """jobguard's name of a statement, or its first word (``INSERT``, ``BEGIN``)."""
    first = text.split()[0]
    return names.get(text, (first.decode() if isinstance(first, bytes) else first).upper())


@contextmanager
def counting(names: dict[str | bytes, str]) -> Iterator[tuple[Counter[str], Counter[str]]]:
    """Count every statement psycopg runs in this process, by jobguard's name where known, and
    every wait for the server (a round trip): ``(statements, waits)``."""
    counts: Counter[str] = Counter()
    waits: Counter[str] = Counter()
    execute = psycopg.Cursor.execute
    enter, leave = psycopg.Transaction.__enter__, psycopg.Transaction.__exit__
    fetch_gen = _pipeline_base.BasePipeline._fetch_gen
    run = OneTrip.run

    def counted_execute(self: Any, query: Any, params: Any = None, **options: Any) -> Any:
        if not isinstance(query, str | bytes):
            query = query.as_string(self.connection)
        name = statement_name(names, query)
        counts[name] += 1
        if self.connection._pipeline is None:
            waits[name] += 1
        return execute(self, query, params, **options)

    def ends(tx: Any) -> tuple[str, str]:
        nested = tx.savepoint_name is not None and tx.connection._num_transactions > 1
        return ("SAVEPOINT", "RELEASE") if nested else ("BEGIN", "COMMIT")

    def counted_enter(self: Any) -> Any:
        entered = enter(self)
        name = ends(self)[0]  # read once entered: only then is it known to be nested
        counts[name] += 1
        if self.connection._pipeline is None:
            waits[name] += 1
        return entered

    def counted_leave(self: Any, *exc: Any) -> Any:
        name = ends(self)[1] if exc[0] is None else "ROLLBACK"
        counts[name] += 1
        if self.connection._pipeline is None:
            waits[name] += 1
        return leave(self, *exc)

    def counted_fetch_gen(self: Any, *, flush: bool) -> Any:
        if self.result_queue:
            waits["(pipeline: sync or fetch)"] += 1
        return fetch_gen(self, flush=flush)

    def counted_run(self: OneTrip, calls: Any) -> Any:
        # Statements sent through libpq, not a cursor, together: db_writes' transaction, and
        # the first and the last statements of a transaction of the driver's write.
        counts.update(map(partial(statement_name, names), [call.native for call in calls]))
        waits["(one trip)"] += 1
        return run(self, calls)

    # A transaction counted where it begins and ends, however it was opened.
    with (
        patch.object(psycopg.Cursor, "execute", counted_execute),
        patch.multiple(psycopg.Transaction, __enter__=counted_enter, __exit__=counted_leave),
        patch.object(_pipeline_base.BasePipeline, "_fetch_gen", counted_fetch_gen),
        patch.object(OneTrip, "run", counted_run),
    ):
        yield counts, waits


_TABLE_COUNTS = {
    "written": "n_tup_ins + n_tup_upd + n_tup_del",
    "updated": "n_tup_upd",
    "heap_only": "n_tup_hot_upd",
}


def server_tally(url: str, schema: str) -> dict[str, Counter[str]]:
    """What the server has done so far to the store's tables (and ``bench_effects``): rows
    written (inserted, updated, deleted), rows updated and those of them updated heap-only
    (no index entry written), per table; under ``totals``, the pages of the store's tables and
    indexes read (from shared buffers or not) and the write-ahead log's position in bytes.
    Counts, not times: what one drain costs the server whatever else the machine runs."""
    tally: dict[str, Counter[str]] = {}
    with psycopg.connect(url, autocommit=True) as conn:
        for name, counts in _TABLE_COUNTS.items():
            found = conn.execute(
                f"SELECT relname, {counts} FROM pg_stat_user_tables"
                " WHERE schemaname = %s OR relname = 'bench_effects'",
                [schema],
            ).fetchall()
            tally[name] = Counter({str(table): int(count) for table, count in found})
        pages, wal = conn.execute(
            "SELECT (SELECT sum(coalesce(heap_blks_read, 0) + coalesce(heap_blks_hit, 0)"
            " + coalesce(idx_blks_read, 0) + coalesce(idx_blks_hit, 0))"
            " FROM pg_statio_user_tables WHERE schemaname = %s),"
            " pg_current_wal_insert_lsn() - '0/0'::pg_lsn",
            [schema],
        ).fetchone() or (0, 0)
    tally["totals"] = Counter({"pages": int(pages or 0), "wal": int(wal)})
    return tally


def since(
    before: dict[str, Counter[str]], after: dict[str, Counter[str]]
) -> dict[str, Counter[str]]:
    """Each count of ``after`` less the same count of ``before`` (none there: zero)."""
    return {
        name: Counter(
            {key: after[name][key] - before.get(name, Counter())[key] for key in after[name]}
        )
        for name in after
    }


def server_cpu_s(url: str) -> float:
    """CPU seconds used so far by this process's server connections (they are named after it)."""
    with psycopg.connect(url, autocommit=True) as conn:
        pids = [
            row[0]
            for row in conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE application_name = %s",
                [f"jobguard:{os.getpid()}"],
            )
        ]
    total = 0.0
    for pid in pids:
        try:
            total += cpu_seconds(pid)
        except OSError:
            continue  # on another host, or gone
    return total


def hold_running(url: str, schema: str, count: int) -> None:
    """``count`` jobs of queue ``held`` running under another worker's leases, which expire
    long after the drain: the running jobs of the other workers of a shared store."""
    if count == 0:
        return
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "INSERT INTO {}.jobs (task, queue, payload, status, available_at, run_at,"
                " attempts, max_attempts, visibility_timeout_s, lease_token, worker_id,"
                " created_at) SELECT 'held', 'held', '{{}}', 'running', 4e9, 0, 1, 5, 3600,"
                " 'held-lease:' || n, 'held-worker', 0 FROM generate_series(1, %s) AS n"
            ).format(sql.Identifier(schema)),
            [count],
        )


STORE_TABLES = ("jobs", "attempts", "locks", "slots", "operations", "steps")


def vacuum_analyze(url: str, schema: str, tables: list[str]) -> dict[str, Counter[str]]:
    """``VACUUM ANALYZE`` each of the store's ``tables``; what that did to the server's counts
    (:func:`server_tally`), to be taken out of the drain's; with no tables, nothing is read."""
    if not tables:
        return {}
    before = server_tally(url, schema)
    with psycopg.connect(url, autocommit=True) as conn:
        for table in tables:
            conn.execute(sql.SQL("VACUUM ANALYZE {}").format(sql.Identifier(schema, table)))
    return since(before, server_tally(url, schema))


def autovacuum(url: str) -> str:
    """The server's autovacuum setting."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SHOW autovacuum").fetchone()
    assert row is not None
    return str(row[0])


def print_tally(tally: dict[str, Counter[str]], jobs: int) -> None:
    """The server's counts of one drain, per job."""
    written, updated, heap_only = tally["written"], tally["updated"], tally["heap_only"]
    rows = ", ".join(f"{name} {count / jobs:.2f}" for name, count in written.most_common() if count)
    print(f"rows written per job: {sum(written.values()) / jobs:.1f} ({rows})")
    shares = ", ".join(
        f"{name} {heap_only[name] / count:.0%}" for name, count in updated.most_common() if count
    )
    print(f"updates that wrote no index entry (heap-only): {shares}")
    print(f"write-ahead log per job: {tally['totals']['wal'] / jobs:.0f} bytes")
    pages = tally["totals"]["pages"] / jobs
    print(f"pages of the store's tables and indexes read per job: {pages:.1f}")


def arguments() -> argparse.Namespace:
    """The command line, ``--analyze`` read into ``analyzed`` (a list of store tables)."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--job",
        choices=("full", "writes", "plain", "retry"),
        default="full",
        help="full guard (db_step), full guard (db_writes), plain, or the full guard with a "
        "third of the jobs retrying once",
    )
    parser.add_argument("--jobs", type=int, default=600)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument(
        "--held",
        type=int,
        default=0,
        help="jobs of another queue held running by another worker all along (their leases "
        "unexpired): what a store shared by many workers holds while this one drains",
    )
    parser.add_argument(
        "--analyze",
        default="",
        help="store tables (comma-separated) to VACUUM ANALYZE after the enqueue, before the "
        "drain: what a statistics run leaves the planner with, the jobs queued and the rest "
        "still empty (its own reads and log are not counted)",
    )
    args = parser.parse_args()
    args.analyzed = [name for name in args.analyze.split(",") if name]
    unknown = set(args.analyzed) - set(STORE_TABLES)
    if unknown:
        parser.error(f"--analyze: not a store table: {', '.join(sorted(unknown))}")
    return args


def enqueue(module: Any, job: str, jobs: int) -> None:
    """``jobs`` jobs of the bench's ``job`` kind, enqueued in one batch."""
    now = time.time()
    if job == "full":
        module.full.enqueue_many({"n": n, "t": now} for n in range(jobs))
    elif job == "writes":
        module.full_writes.enqueue_many({"n": n, "t": now} for n in range(jobs))
    elif job == "retry":
        module.full_retry.enqueue_many({"n": n, "t": now} for n in range(jobs))
    else:
        module.noop.enqueue_many({"n": n} for n in range(jobs))


def main() -> None:
    """Prefill, drain in-process while counting, print round trips per job."""
    args = arguments()
    with scratch_database() as url:
        store = BenchStore("postgres", url, Path(tempfile.mkdtemp()), "round_trips")
        module = load("bench.apps", store.url)
        hold_running(url, store.schema, args.held)
        # Before the enqueue, so every job's insert counts (the enqueue is part of its cost).
        tally_before = server_tally(url, store.schema)
        enqueue(module, args.job, args.jobs)
        statistics_run = vacuum_analyze(url, store.schema, args.analyzed)
        names = statement_names(store.schema)
        worker = Worker(module.app, queues=[args.job], concurrency=args.concurrency)
        cpu_before = time.process_time()
        with counting(names) as (counts, waits):
            worker.run(burst=True)
        worker_cpu = time.process_time() - cpu_before
        server_cpu = server_cpu_s(url)
        module.app.close()
        time.sleep(2.0)  # the server processes report their row counts as they exit
        tally = since(statistics_run, since(tally_before, server_tally(url, store.schema)))
        done = store.completed()
        vacuum = autovacuum(url)
    jobs = args.jobs
    held = f"; {args.held} jobs of another worker running all along" if args.held else ""
    if args.analyzed:
        held += f"; VACUUM ANALYZE of {', '.join(args.analyzed)} after the enqueue"
    print(f"{jobs} {args.job} jobs, 1 worker process x {args.concurrency} threads{held}")
    print(f"(server autovacuum: {vacuum}; each run starts from a fresh database)")
    print(f"completed: {done}; round trips per job: {sum(waits.values()) / jobs:.1f}")
    print(f"statements per job: {sum(counts.values()) / jobs:.1f}")
    print_tally(tally, jobs)
    print(
        f"CPU per job: worker {worker_cpu / jobs * 1e3:.3f} ms, "
        f"server {server_cpu / jobs * 1e3:.3f} ms (its connections)"
    )
    print("round trips by statement:")
    for name, count in waits.most_common():
        print(f"{count / jobs:7.2f}  {name}")
    print("statements:")
    for name, count in counts.most_common():
        print(f"{count / jobs:7.2f}  {name}")


if __name__ == "__main__":
    main()
