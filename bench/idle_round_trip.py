"""What an idle pause costs the next round trip: why pickup at a low rate is slower than a drain.

Usage (from the repository root, PostgreSQL on 127.0.0.1:5432)::

    python -m bench.idle_round_trip                  # pauses of 0, 1, 10 and 40 ms
    python -m bench.idle_round_trip --pauses 0,5,40 --runs 100

In a throw-away database with a migrated jobguard schema and an empty queue, one process
sends, after each pause: a bare ``SELECT 1`` on a psycopg connection of its own, and the
store's real fetch (``fetch_prepared``: the one statement that picks, leases and begins a
batch, which finds nothing here). Each line gives the median and the 90th percentile of the
call's wall time over ``--runs`` calls (the first ten, which prepare the statements, left
out). A pickup bench enqueues one job every 40 ms, so every round trip on its way starts from
an idle client, an idle server backend and idle cores; a drain never pauses.
The output is also written to ``bench/results/idle-round-trip-DATE.txt``.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import psycopg

from bench.compare import results_run
from bench.measure import load
from jobguard.diagnostics.durations import percentile

WARM_RUNS = 10


def timed(call: Callable[[], object], pause_s: float, runs: int) -> list[float]:
    """Wall milliseconds of ``call`` after each ``pause_s`` of sleep (warm runs left out)."""
    took = []
    for _ in range(WARM_RUNS + runs):
        time.sleep(pause_s)
        started = time.perf_counter()
        call()
        took.append(1000 * (time.perf_counter() - started))
    return sorted(took[WARM_RUNS:])


def main() -> None:
    """Time both calls after every pause."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--pauses",
        type=lambda text: [float(ms) / 1000 for ms in text.split(",")],
        default=[0.0, 0.001, 0.01, 0.04],
        help="milliseconds of idle before each call, comma-separated (default 0,1,10,40)",
    )
    parser.add_argument("--runs", type=int, default=200, help="calls per pause")
    args = parser.parse_args()
    with results_run("idle-round-trip", "python -m bench.idle_round_trip") as (say, url):
        say("median / p90 ms of one call after each idle pause")
        module = load("bench.apps", url)
        module.app.migrate()
        backend = module.app.backend
        rules = {name: task.delivery_rules() for name, task in module.app.tasks.items()}
        with psycopg.connect(url, autocommit=True) as conn:
            calls: dict[str, Callable[[], object]] = {
                "SELECT 1": lambda: conn.execute("SELECT 1").fetchall(),
                "jobguard fetch, empty queue": lambda: backend.fetch_prepared(
                    ["full"], 4, "bench", rules
                ),
            }
            for pause_s in args.pauses:
                for name, call in calls.items():
                    took = timed(call, pause_s, args.runs)
                    say(
                        f"pause {1000 * pause_s:5.1f} ms  {name:28} {percentile(took, 50):6.3f} / "
                        f"{percentile(took, 90):6.3f} ms"
                    )
        module.app.close()


if __name__ == "__main__":
    main()
