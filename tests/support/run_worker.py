"""Entry point of a real worker process in tests: ``python -m tests.support.run_worker``.

The app module must define ``make_app(url: str) -> App``. Prints ``READY <pid>`` once the worker
is about to fetch, so tests can wait for it instead of sleeping.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time

SKEW_ENV = "TEST_CLOCK_SKEW_S"


def skew_wall_clock() -> None:
    """Simulate a host whose wall clock is off: ``time.time()`` of this process is moved by
    ``TEST_CLOCK_SKEW_S`` seconds (the monotonic clocks are left alone, as NTP leaves them)."""
    skew_s = float(os.environ.get(SKEW_ENV, "0") or 0)
    if skew_s:
        real_time, real_time_ns = time.time, time.time_ns
        time.time = lambda: real_time() + skew_s  # type: ignore[assignment]
        time.time_ns = lambda: real_time_ns() + int(skew_s * 1e9)  # type: ignore[assignment]


def main() -> None:
    """Parse arguments, build the app and run one worker until stopped."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True, help="the store's URL")
    parser.add_argument("--app", required=True, help="module defining make_app(url)")
    parser.add_argument("--queues", default="")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--prefetch", type=int, default=0)
    parser.add_argument("--grace-s", type=float, default=5.0)
    parser.add_argument("--worker-id", default=None)
    parser.add_argument("--burst", action="store_true")
    parser.add_argument("--no-heartbeat", action="store_true")
    args = parser.parse_args()
    skew_wall_clock()
    module = importlib.import_module(args.app)
    app = module.make_app(args.url)
    worker = app.worker(
        [q for q in args.queues.split(",") if q] or None,
        concurrency=args.concurrency,
        prefetch=args.prefetch,
        grace_s=args.grace_s,
        worker_id=args.worker_id or f"w{os.getpid()}",
        heartbeat=not args.no_heartbeat,
        poll_interval_s=0.05,
    )
    print(f"READY {os.getpid()}", flush=True)
    worker.run(burst=args.burst)
    if worker.failure is not None:  # the heartbeat failed, or the store became unusable
        print(f"FAILED {worker.failure}", flush=True)
        sys.exit(1)
    print(f"STOPPED released={worker.stats.released}", flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
