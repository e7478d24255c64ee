"""Fetch latency on PostgreSQL with 1,000,000 jobs queued against a near-empty queue.

Usage (from the repository root, PostgreSQL on 127.0.0.1:5432)::

    python -m bench.fetch_depth                   # 1,000,000 queued, batches of 8 and 32
    python -m bench.fetch_depth --depth 200000 --fetches 100

In a throw-away database, one fresh jobguard schema holds only the jobs the measured fetches
lease ("shallow"), another is bulk-loaded with ``--depth`` queued jobs by one
``INSERT ... SELECT generate_series`` ("deep"), then analysed as autovacuum would. Each fetch is
the store's real ``fetch_prepared`` without a begin (the ready check when the last fetch found
nothing, then one statement that picks with ``FOR UPDATE SKIP LOCKED``, leases and writes the
attempt rows, committed on its own), timed one after another from one process; p50/p95 in
ms. A fetch from an empty queue (nothing to lease) is timed too.
The output is also written to ``bench/results/fetch-depth-DATE.txt``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import secrets
import time
from pathlib import Path

import psycopg
from psycopg import sql

from bench.compare import RESULTS, Tee, measured_on_scratch
from jobguard.backends import migrate_store
from jobguard.backends.postgres import PostgresBackend
from jobguard.diagnostics.durations import percentile

QUEUE = "deep"

LOAD = """
INSERT INTO {schema}.jobs (task, queue, payload, status, available_at, run_at, max_attempts,
                           visibility_timeout_s, created_at)
SELECT 'noop', %(queue)s, '{{"n": ' || g || '}}', 'queued', %(now)s, %(now)s, 3, 30, %(now)s
FROM generate_series(1, %(count)s) AS g
"""


def fresh_store(database_url: str, count: int, analyse: bool) -> tuple[str, float]:
    """A new schema with ``count`` queued jobs; its URL and the load time in seconds."""
    schema = f"depth_{secrets.token_hex(3)}"
    url = f"{database_url}?schema={schema}"
    migrate_store(url)
    started = time.perf_counter()
    with psycopg.connect(database_url, autocommit=True) as conn:
        query = sql.SQL(LOAD).format(schema=sql.Identifier(schema))
        conn.execute(query, {"queue": QUEUE, "now": time.time() - 60, "count": count})
        if analyse:
            conn.execute(sql.SQL("ANALYZE {}.jobs").format(sql.Identifier(schema)))
    return url, time.perf_counter() - started


def time_fetches(url: str, batch: int, fetches: int, expect: int | None = None) -> list[float]:
    """Milliseconds per ``fetch`` of ``batch`` jobs, ``fetches`` times in a row.

    Each fetch must lease ``expect`` jobs (default ``batch``).
    """
    expect = batch if expect is None else expect
    backend = PostgresBackend(url)
    try:
        backend.fetch_prepared([QUEUE], batch, "bench-warm-up")  # opens the pool's connection
        took: list[float] = []
        for _ in range(fetches):
            started = time.perf_counter()
            got = backend.fetch_prepared([QUEUE], batch, "bench-fetch")
            took.append((time.perf_counter() - started) * 1000)
            if len(got) != expect:
                raise SystemExit(f"fetch leased {len(got)} jobs, not {expect}")
        return sorted(took)
    finally:
        backend.close()


def measure(database_url: str, args: argparse.Namespace, batches: list[int], say: Tee) -> None:
    """Load the stores, time the fetches, print the figures."""
    needed = sum(batch * (args.fetches + 1) for batch in batches)  # warm-up fetches too
    shallow, _ = fresh_store(database_url, needed, analyse=True)
    deep, load_s = fresh_store(database_url, args.depth + needed, analyse=True)
    say(
        f"near-empty queue: the {needed:,} jobs the fetches lease; deep queue: "
        f"{args.depth:,} more, loaded in {load_s:.1f} s and analysed"
    )
    empty, _ = fresh_store(database_url, 0, analyse=True)
    took = time_fetches(empty, batches[0], args.fetches, expect=0)
    say(f"empty queue (nothing to lease): p50 {percentile(took, 50):.2f} ms")
    for batch in batches:
        base = time_fetches(shallow, batch, args.fetches)
        loaded = time_fetches(deep, batch, args.fetches)
        ratio = percentile(loaded, 50) / percentile(base, 50)
        say(
            f"lease {batch:3d} per fetch: near-empty queue p50 {percentile(base, 50):6.2f} "
            f"p95 {percentile(base, 95):6.2f} ms; {args.depth:,} queued p50 "
            f"{percentile(loaded, 50):6.2f} p95 {percentile(loaded, 95):6.2f} ms; "
            f"ratio {ratio:.2f}x (target <= 2x: {'met' if ratio <= 2 else 'missed'})"
        )


def main() -> None:
    """Load, fetch, print."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--depth", type=int, default=1_000_000, help="jobs queued in the deep run")
    parser.add_argument("--fetches", type=int, default=200, help="fetches timed per case")
    parser.add_argument("--batches", default="8,32", help="jobs per fetch, comma-separated")
    parser.add_argument("--out", type=Path, default=None, help="results file")
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    out = args.out or RESULTS / f"fetch-depth-{dt.date.today().isoformat()}.txt"
    measured_on_scratch(
        out, "bench.fetch_depth", "fetch depth", lambda url, say: measure(url, args, batches, say)
    )


if __name__ == "__main__":
    main()
