"""Round trips to PostgreSQL per job: which statements a job costs, counted in one worker.

Usage (from the repository root, after ``pip install -e '.[postgres,bench]'``)::

    python -m bench.round_trips                 # 600 full-guard jobs, 4 threads
    python -m bench.round_trips --job plain --jobs 2000 --concurrency 16

A worker runs in this process (``Worker.run(burst=True)``) over a prefilled queue in a
throw-away database; every statement psycopg sends is counted by name (jobguard's named
statements, the task's own insert, and BEGIN/COMMIT/SAVEPOINT/RELEASE of the transactions).
Each is one round trip to the server. Round trips, not time, are what this measures: they set
the CPU per job of the worker and of the server, and so the throughput on a small machine.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg

from bench.measure import load
from bench.pgdb import scratch_database
from bench.stores import BenchStore
from jobguard.backends.postgres.driver import render_queries
from jobguard.worker import Worker


@contextmanager
def counting(names: dict[str, str]) -> Iterator[Counter[str]]:
    """Count every statement psycopg runs in this process, by jobguard's name where known."""
    counts: Counter[str] = Counter()
    execute = psycopg.Cursor.execute
    transaction = psycopg.Connection.transaction

    def counted_execute(self: Any, query: Any, params: Any = None, **options: Any) -> Any:
        text = query if isinstance(query, str) else query.as_string(self.connection)
        counts[names.get(text, text.split()[0].upper())] += 1
        return execute(self, query, params, **options)

    @contextmanager
    def counted_transaction(self: Any, *args: Any, **options: Any) -> Iterator[Any]:
        nested = self.info.transaction_status != psycopg.pq.TransactionStatus.IDLE
        counts["SAVEPOINT + RELEASE" if nested else "BEGIN + COMMIT"] += 2
        with transaction(self, *args, **options) as tx:
            yield tx

    psycopg.Cursor.execute = counted_execute  # type: ignore[assignment,method-assign]
    psycopg.Connection.transaction = counted_transaction  # type: ignore[assignment,method-assign]
    try:
        yield counts
    finally:
        psycopg.Cursor.execute = execute  # type: ignore[method-assign]
        psycopg.Connection.transaction = transaction  # type: ignore[method-assign]


def main() -> None:
    """Prefill, drain in-process while counting, print round trips per job."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--job", choices=("full", "plain"), default="full")
    parser.add_argument("--jobs", type=int, default=600)
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args()
    with scratch_database() as url:
        store = BenchStore("postgres", url, Path(tempfile.mkdtemp()), "round_trips")
        module = load("bench.apps", store.url)
        now = time.time()
        if args.job == "full":
            module.full.enqueue_many({"n": n, "t": now} for n in range(args.jobs))
        else:
            module.noop.enqueue_many({"n": n} for n in range(args.jobs))
        names = {text: name for name, text in render_queries(store.schema).items()}
        worker = Worker(module.app, queues=[args.job], concurrency=args.concurrency)
        with counting(names) as counts:
            worker.run(burst=True)
        module.app.close()
        done = store.completed()
    print(f"{args.jobs} {args.job} jobs, 1 worker process x {args.concurrency} threads")
    print(f"completed: {done}; round trips per job: {sum(counts.values()) / args.jobs:.1f}")
    for name, count in counts.most_common():
        print(f"{count / args.jobs:7.2f}  {name}")


if __name__ == "__main__":
    main()
