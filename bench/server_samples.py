"""Where PostgreSQL's backends spend a drain, statement by statement, from pg_stat_activity.

Usage (from the repository root, PostgreSQL on 127.0.0.1:5432)::

    python -m bench.server_samples                    # a writes:16 drain of 60,000 jobs
    python -m bench.server_samples --shape full:4 --jobs 20000 --seconds 5

Runs ``python -m bench.drains --shapes SHAPE --jobs JOBS`` in a child process and, once one of
the server's backends runs jobguard's fetch (the drain has begun), reads ``pg_stat_activity``
every 2 ms for ``--seconds``. Each client backend in state ``active`` counts once a sample,
under the first line of its query (jobguard's statements open with a comment saying what they
are) and what it waits for: ``CPU`` when it names no wait (on a core, or in the run queue for
one). A pipelined transaction committed by its Sync shows the last statement sent, so a step's
wait for its commit to reach the disk is counted under the business ``INSERT``. Printed: each
(statement, wait) pair's share of every backend sample, the largest first, then the drain's own
line. The output is also written to ``bench/results/server-samples-DATE.txt``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import subprocess
import sys
import time
from collections import Counter

import psycopg

from bench.compare import RESULTS, Tee
from bench.pgdb import ADMIN_URL
from bench.procs import bench_env

FETCH_OPENING = "-- A fetch's pick and lease"
ACTIVE = """
SELECT query, coalesce(wait_event_type || ':' || wait_event, 'CPU')
FROM pg_stat_activity
WHERE state = 'active' AND backend_type = 'client backend' AND pid <> pg_backend_pid()
"""
PAUSE_S = 0.002


def first_line(query: str) -> str:
    """The statement's first line, cut to fit a column."""
    text = query.strip()
    return text.splitlines()[0][:60] if text else "?"


def sample(conn: psycopg.Connection[tuple[str, str]], seconds: float) -> Counter[tuple[str, str]]:
    """Active backends by (statement, wait) over ``seconds``, once the drain's fetch shows."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if any(query.lstrip().startswith(FETCH_OPENING) for query, _ in conn.execute(ACTIVE)):
            break
        time.sleep(PAUSE_S)
    counts: Counter[tuple[str, str]] = Counter()
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        for query, wait in conn.execute(ACTIVE):
            counts[(first_line(query), wait)] += 1
        time.sleep(PAUSE_S)
    return counts


def main() -> None:
    """Drain and sample; print the shares."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--shape", default="writes:16", help="a bench.drains shape, JOB:THREADS")
    parser.add_argument("--jobs", type=int, default=60000, help="jobs to drain (outlast sampling)")
    parser.add_argument("--seconds", type=float, default=8.0, help="how long to sample")
    args = parser.parse_args()
    drain = [sys.executable, "-m", "bench.drains", "--shapes", args.shape, "--jobs", str(args.jobs)]
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"server-samples-{dt.date.today().isoformat()}.txt"
    with path.open("a") as sink, psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        say = Tee(sink)
        say(
            f"$ python -m bench.server_samples --shape {args.shape} --jobs {args.jobs} "
            f"--seconds {args.seconds:g}"
        )
        child = subprocess.Popen(drain, env=bench_env(), stdout=subprocess.PIPE, text=True)
        counts = sample(conn, args.seconds)
        out, _ = child.communicate(timeout=600)
        total = sum(counts.values()) or 1
        say(f"{total} backend samples; share of them by statement and wait:")
        for (statement, wait), n in counts.most_common():
            if 100 * n / total >= 0.1:
                say(f"{100 * n / total:5.1f}%  {wait:22} {statement}")
        for line in out.splitlines():
            if not line.startswith("written to"):
                say(line)
    print(f"written to {path}")


if __name__ == "__main__":
    main()
