"""What taking a pooled connection for every transaction costs threads of one busy process.

Usage (from the repository root, PostgreSQL on 127.0.0.1:5432)::

    python -m bench.pool_checkout                          # 16 threads, 4 s a run, 3 rounds
    python -m bench.pool_checkout --threads 1,4,16 --seconds 5 --rounds 2
    python -m bench.pool_checkout --unlogged               # commits that skip the WAL's flush

In a throw-away database, ``--threads`` threads of this process each run, for ``--seconds``,
transactions of the shape of a ``db_writes`` step: two prepared INSERTs sent together in one
psycopg pipeline (one round trip). ``pooled``: each transaction on a connection taken from a
psycopg_pool ``ConnectionPool`` (one connection a thread) and given back, on a new cursor, as
jobguard's calls did before its worker's threads kept their connections. ``kept``: each thread
on a connection of its own. After the first second, the process's CPU time and context
switches are read from ``getrusage`` at the start and end of the window and divided by the
transactions done in between. The two modes alternate, ``--rounds`` times. ``--unlogged``
writes to an unlogged table: commits wait for no disk, so the threads contend harder. The
output is also
written to ``bench/results/pool-checkout-DATE.txt``.
"""

from __future__ import annotations

import argparse
import resource
import threading
import time
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool

from bench.compare import results_run

INSERT = "INSERT INTO pool_checkout (thread, n) VALUES (%s, %s)"


def run(url: str, mode: str, threads: int, seconds: float) -> str:
    """One window of ``threads`` threads in ``mode``; its line of the table."""
    done = [0] * threads
    stop = threading.Event()
    pool: ConnectionPool[psycopg.Connection[Any]] = ConnectionPool(
        url, min_size=threads, max_size=threads, kwargs={"autocommit": True}, open=True
    )

    def pooled(index: int) -> None:
        while not stop.is_set():
            with pool.connection() as conn:
                cursor = conn.cursor()
                with conn.pipeline():
                    cursor.execute(INSERT, (index, 0), prepare=True)
                    cursor.execute(INSERT, (index, 1), prepare=True)
            done[index] += 1

    def kept(index: int) -> None:
        with psycopg.connect(url, autocommit=True) as conn:
            cursor = conn.cursor()
            while not stop.is_set():
                with conn.pipeline():
                    cursor.execute(INSERT, (index, 0), prepare=True)
                    cursor.execute(INSERT, (index, 1), prepare=True)
                done[index] += 1

    body = pooled if mode == "pooled" else kept
    running = [threading.Thread(target=body, args=(index,)) for index in range(threads)]
    try:
        for thread in running:
            thread.start()
        time.sleep(1.0)
        start, before, at = sum(done), resource.getrusage(resource.RUSAGE_SELF), time.time()
        time.sleep(seconds)
        end, after, until = sum(done), resource.getrusage(resource.RUSAGE_SELF), time.time()
    finally:
        stop.set()
        for thread in running:
            thread.join()
        pool.close()
    count = max(1, end - start)
    cpu_s = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return (
        f"{mode:6} {threads:3} threads  {count / (until - at):7.0f} tx/s  "
        f"client CPU {cpu_s / count * 1e6:6.1f} us/tx  switches: voluntary "
        f"{(after.ru_nvcsw - before.ru_nvcsw) / count:5.2f}, involuntary "
        f"{(after.ru_nivcsw - before.ru_nivcsw) / count:5.2f} per tx"
    )


def main() -> None:
    """Alternate the two modes at each thread count."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--threads", default="16", help="thread counts, comma-separated")
    parser.add_argument("--seconds", type=float, default=4.0, help="measured window of a run")
    parser.add_argument("--rounds", type=int, default=3, help="times through both modes")
    parser.add_argument("--unlogged", action="store_true", help="an unlogged table")
    args = parser.parse_args()
    counts = [int(part) for part in args.threads.split(",")]
    command = (
        f"python -m bench.pool_checkout --threads {args.threads} --seconds {args.seconds} "
        f"--rounds {args.rounds}{' --unlogged' if args.unlogged else ''}"
    )
    with results_run("pool-checkout", command) as (say, url):
        with psycopg.connect(url, autocommit=True) as conn:
            kind = "UNLOGGED TABLE" if args.unlogged else "TABLE"
            conn.execute(f"CREATE {kind} pool_checkout (thread integer, n integer)")
        for _ in range(args.rounds):
            for threads in counts:
                for mode in ("pooled", "kept"):
                    say(run(url, mode, threads, args.seconds))


if __name__ == "__main__":
    main()
