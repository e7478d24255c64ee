"""The fetch's cost on PostgreSQL as the history of operations grows under one connection.

Usage (from the repository root, PostgreSQL on 127.0.0.1:5432)::

    python -m bench.fetch_history                  # 24,000 full-guard jobs, batches of 4
    python -m bench.fetch_history --jobs 12000 --batch 8 --segment 2000

In a throw-away database, a fresh jobguard schema (never analysed: autovacuum is off on the
bench machine) gets ``--jobs`` queued jobs of the full guard (``bench.apps``: each with its own
operation key and resource). One process then takes them with the store's real
``fetch_prepared``, ``--batch`` at a time, on the one pooled connection it opens: every fetch
leases its jobs, grants their locks, claims their operations and writes their attempt rows, so
the ``operations`` table grows by one row per job leased. Nothing is settled. For each
``--segment`` of jobs: this process's CPU per job and the server's (the database's backends),
and the wall time per job. A fetch whose cost grows with the history shows it here: a
prepared statement keeps the plan made in its first runs, when the tables were small.
The output is also written to ``bench/results/fetch-history-DATE.txt``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import resource
import time
from pathlib import Path

from bench import procs
from bench.compare import RESULTS, Tee, measured_on_scratch
from bench.measure import load
from bench.stores import BenchStore

QUEUE = "full"


def own_cpu_s() -> float:
    """This process's user + system CPU seconds so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def measure(database_url: str, args: argparse.Namespace, say: Tee) -> None:
    """Queue the jobs, fetch them all, print each segment's costs."""
    store = BenchStore("postgres", database_url, Path("."), "history")  # no files: PostgreSQL
    module = load("bench.apps", store.url)
    now = time.time()
    for start in range(0, args.jobs, 1000):
        module.full.enqueue_many(
            {"n": n, "t": now} for n in range(start, min(args.jobs, start + 1000))
        )
    app = module.app
    rules = {name: task.delivery_rules() for name, task in app.tasks.items()}
    try:
        taken = len(app.backend.fetch_prepared([QUEUE], 1, "bench-history", rules))
        backends = procs.database_backends(database_url)  # the pool's connection, open now
        say(f"{args.jobs:,} jobs queued; fetches of {args.batch}; per segment of {args.segment:,}")
        while taken + args.segment <= args.jobs:
            got = 0
            cpu0, server0, wall0 = own_cpu_s(), procs.total_cpu_s(backends), time.perf_counter()
            while got < args.segment:
                fetched = app.backend.fetch_prepared([QUEUE], args.batch, "bench-history", rules)
                if not fetched:
                    raise SystemExit(f"the queue ran dry after {taken + got} jobs")
                got += len(fetched)
            wall = time.perf_counter() - wall0
            cpu, server = own_cpu_s() - cpu0, procs.total_cpu_s(backends) - server0
            taken += got
            say(
                f"jobs {taken - got + 1:6,}-{taken:6,} (operations before: {taken - got:6,}): "
                f"CPU per job: this process {1000 * cpu / got:.3f} ms, server "
                f"{1000 * server / got:.3f} ms; wall {1000 * wall / got:.3f} ms"
            )
    finally:
        app.close()


def main() -> None:
    """Queue, fetch, print."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--jobs", type=int, default=24_000, help="jobs queued and fetched")
    parser.add_argument("--batch", type=int, default=4, help="jobs per fetch")
    parser.add_argument("--segment", type=int, default=4000, help="jobs per line of figures")
    parser.add_argument("--out", type=Path, default=None, help="results file")
    args = parser.parse_args()
    out = args.out or RESULTS / f"fetch-history-{dt.date.today().isoformat()}.txt"
    measured_on_scratch(
        out, "bench.fetch_history", "fetch history", lambda url, say: measure(url, args, say)
    )


if __name__ == "__main__":
    main()
