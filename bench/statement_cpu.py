"""The client CPU of sending one of jobguard's statements: its text read by psycopg, its cursor.

Usage (from the repository root, PostgreSQL on 127.0.0.1:5432)::

    python -m bench.statement_cpu
    python -m bench.statement_cpu --calls 5000 --rounds 5

Two measures, each alternating its two ways ``--rounds`` times and printing the median, in
microseconds of this process's CPU (``time.process_time``) per call:

- ``read``: psycopg turning a named statement's text and values into what it sends (its
  ``PostgresQuery.convert``, which caches texts up to 4,096 bytes only), against the native form
  jobguard converts once (:mod:`jobguard.backends.postgres.statements`, sent by ``RawCursor``,
  which reads nothing). For the fetch (``lease_and_begin``), the settle (``settle_set``) and a
  ``db_writes`` step's record (``insert_step_or_fail``), values standing in for real ones.
- ``cursor``: one prepared INSERT of ten values in a psycopg pipeline, sent on a new cursor
  each time (how jobguard sent its statements before) against one cursor kept by the
  connection (:class:`~jobguard.backends.postgres.pooled.PooledConnection`), into a temporary
  table. This one includes the round trip's system calls, so its two ways differ by less than
  its spread on a busy machine; the median of many rounds shows it.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg._queries import PostgresQuery, PostgresRawQuery
from psycopg.adapt import Transformer

from jobguard.backends.postgres.driver import render_queries
from jobguard.backends.postgres.statements import Statement, native_statements

STATEMENTS = ("lease_and_begin", "settle_set", "insert_step_or_fail")
INSERT = b"INSERT INTO statement_cpu VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)"
VALUES = ["key:1", "step", 3, 4, "lease-token", None, "order:1", None, None, "null"]


def per_call_us(call: Callable[[], Any], calls: int) -> float:
    """Process CPU per call of ``call``, in microseconds."""
    start = time.process_time()
    for _ in range(calls):
        call()
    return (time.process_time() - start) / calls * 1e6


def median_of(ways: dict[str, Callable[[], Any]], calls: int, rounds: int) -> dict[str, float]:
    """Each way's median per-call CPU over ``rounds`` alternating runs (after a warm-up)."""
    runs: dict[str, list[float]] = {name: [] for name in ways}
    for call in ways.values():
        per_call_us(call, calls // 10)
    for _ in range(rounds):
        for name, call in ways.items():
            runs[name].append(per_call_us(call, calls))
    return {name: statistics.median(values) for name, values in runs.items()}


def reading(conn: psycopg.Connection[Any], statement: Statement) -> dict[str, Callable[[], Any]]:
    """Both ways of reading ``statement`` with a value for each of its names."""
    params = {name: 1 for name in statement.names}
    values = statement.values(params)
    return {
        "text": lambda: PostgresQuery(Transformer(conn)).convert(statement.text, params),
        "native": lambda: PostgresRawQuery(Transformer(conn)).convert(statement.native, values),
    }


def main() -> None:
    """Print both measures."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--url", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--calls", type=int, default=3000, help="calls a run")
    parser.add_argument("--rounds", type=int, default=5, help="runs of each way")
    args = parser.parse_args()
    if args.calls < 10 or args.rounds < 1:
        parser.error("--calls must be at least 10 and --rounds at least 1")
    texts = render_queries("jobguard")
    natives = native_statements(texts)
    with psycopg.connect(args.url, autocommit=True) as conn:
        print(f"{'statement':<22} {'bytes':>6} {'psycopg reads':>14} {'native':>8}  (us per call)")
        for name in STATEMENTS:
            cpu = median_of(reading(conn, natives[name]), args.calls, args.rounds)
            print(f"{name:<22} {len(texts[name]):>6} {cpu['text']:>14.1f} {cpu['native']:>8.1f}")
        conn.execute(
            "CREATE TEMP TABLE statement_cpu (a text, b text, c int, d bigint, e text, f text,"
            " g text, h int, i bigint, j text)"
        )
        kept = psycopg.RawCursor(conn)

        def send(cursor: psycopg.RawCursor[Any]) -> None:
            with conn.pipeline():
                cursor.execute(INSERT, VALUES, prepare=True)

        cpu = median_of(
            {"new": lambda: send(psycopg.RawCursor(conn)), "kept": lambda: send(kept)},
            args.calls,
            args.rounds,
        )
        print(
            f"one pipelined INSERT of ten values: new cursor {cpu['new']:.1f} us, "
            f"kept cursor {cpu['kept']:.1f} us"
        )


if __name__ == "__main__":
    main()
