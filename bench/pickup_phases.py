"""Where a pickup's time goes, phase by phase: the wake-up, the fetch, the hand-over to a handler.

Usage (from the repository root, PostgreSQL on 127.0.0.1:5432)::

    python -m bench.pickup_phases                     # 250 jobs at 25 jobs/s, 4 threads
    python -m bench.pickup_phases --jobs 500 --concurrency 16

In a throw-away database, one ``Worker`` runs in this process (the ``writes`` job of
:mod:`bench.apps`: the full guard, the business row by ``ctx.db_writes``) with its store's
``fetch_prepared`` timed; a producer process enqueues one job at a time at ``--rate`` and
reports when each enqueue returned. Each job's handler records when it started (the business
row). Printed, p50 / p90 / p99 in ms: enqueue return to the start of the fetch that took the
job, that fetch's own time, the fetch's return to the handler's start, and the whole; the whole
again for the jobs after the first ``--warm`` (a new worker's first fetches wait for its pool
to open connections and for the server to plan its statements on each); and how many fetches
the worker made, how many of them found nothing, and how many jobs waited more than 10 ms
for their fetch (not taken at their own wake-up). The compare bench
(:mod:`bench.compare`) measures pickup with two worker processes; this one shows the phases.
The output is also written to ``bench/results/pickup-phases-DATE.txt``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from typing import Any

import psycopg

from bench.compare import results_run
from bench.measure import load, pace
from bench.procs import bench_env
from jobguard.diagnostics.durations import percentile

# A fetch this late after an enqueue was not woken by that enqueue (a wake-up is well under
# 1 ms): it waited for the next job's wake-up or for the poll.
LATE_MS = 10.0
PHASES = ("enqueue return to fetch start", "fetch", "fetch return to handler start", "whole")


def produce(url: str, jobs: int, rate: int) -> None:
    """The producer process: enqueue ``jobs`` jobs at ``rate``, print each return time."""
    module = load("bench.apps", url)
    sent = pace(lambda n: module.full_writes.enqueue(n=n, t=time.time()), rate, jobs / rate)
    print(json.dumps(sent.returned), flush=True)
    module.app.close()


def measure(url: str, jobs: int, rate: int, concurrency: int) -> tuple[list[list[float]], Any]:
    """Run the worker and the producer; each job's phases in ms, and the fetch calls."""
    module = load("bench.apps", url)
    module.app.migrate()
    backend = module.app.backend
    fetches: list[tuple[float, float, list[int]]] = []
    fetch = backend.fetch_prepared

    def timed_fetch(*args: Any, **kwargs: Any) -> Any:
        started = time.time()
        found = fetch(*args, **kwargs)
        numbers = [json.loads(item.delivery.payload)["n"] for item in found]
        fetches.append((started, time.time(), numbers))
        return found

    backend.fetch_prepared = timed_fetch
    worker = module.app.worker(["writes"], concurrency=concurrency, install_signal_handlers=False)
    running = threading.Thread(target=worker.run, daemon=True)
    running.start()
    started: dict[int, float] = {}
    try:
        time.sleep(1.0)  # the first idle wait has begun: the worker listens
        producer = subprocess.run(
            [sys.executable, "-m", "bench.pickup_phases", "--produce", url, str(jobs), str(rate)],
            env=bench_env(),
            capture_output=True,
            text=True,
            check=True,
        )
        returned = json.loads(producer.stdout.strip().splitlines()[-1])
        deadline = time.monotonic() + 60
        with psycopg.connect(url, autocommit=True) as conn:
            while time.monotonic() < deadline:
                started = dict(conn.execute("SELECT n, started_at FROM bench_effects").fetchall())
                if len(started) >= jobs:
                    break
                time.sleep(0.2)
    finally:
        worker.stop()
        running.join(60)
        module.app.close()
    by_job = {}
    for fetch_start, fetch_end, numbers in fetches:
        for n in numbers:
            if n in started:
                begun = started[n]
                by_job[n] = [
                    1000 * (fetch_start - returned[n]),
                    1000 * (fetch_end - fetch_start),
                    1000 * (begun - fetch_end),
                    1000 * (begun - returned[n]),
                ]
    phases = [by_job[n] for n in sorted(by_job)]  # in the order the jobs were enqueued
    empty = sum(1 for *_, numbers in fetches if not numbers)
    return phases, (len(fetches), empty)


def main() -> None:
    """Measure once and print the phases."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--jobs", type=int, default=250, help="jobs, enqueued one at a time")
    parser.add_argument("--rate", type=int, default=25, help="jobs per second")
    parser.add_argument("--concurrency", type=int, default=4, help="handler threads")
    parser.add_argument(
        "--warm", type=int, default=100, help="jobs left out of the last line (the warm-up)"
    )
    parser.add_argument("--produce", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.produce:
        url, jobs, rate = args.produce
        produce(url, int(jobs), int(rate))
        return
    command = (
        f"python -m bench.pickup_phases --jobs {args.jobs} --rate {args.rate} "
        f"--concurrency {args.concurrency} --warm {args.warm}"
    )
    with results_run("pickup-phases", command) as (say, url):
        phases, (calls, empty) = measure(url, args.jobs, args.rate, args.concurrency)
        lines = [(name, [row[index] for row in phases]) for index, name in enumerate(PHASES)]
        warm = phases[args.warm :]
        if warm:
            lines.append((f"whole, after the first {args.warm}", [row[-1] for row in warm]))
        for name, took in lines:
            took.sort()
            say(
                f"{name:31} p50 {percentile(took, 50):5.2f}  p90 {percentile(took, 90):5.2f}  "
                f"p99 {percentile(took, 99):5.2f} ms"
            )
        say(f"{len(phases)} jobs, {calls} fetches, {empty} of them found nothing")
        late = sum(1 for row in phases if row[0] > LATE_MS)
        say(f"{late} jobs waited more than {LATE_MS:.0f} ms from their enqueue to their fetch")


if __name__ == "__main__":
    main()
