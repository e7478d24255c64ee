"""Pickup across a network: enqueue to handler start on PostgreSQL with latency on the wire.

Usage (from the repository root, after ``pip install -e '.[postgres,bench]'``)::

    python -m bench.pickup_network                     # 0.5 ms each way, 200 jobs
    python -m bench.pickup_network --latency-ms 1 --jobs 100

On a database in another host or zone, every round trip costs the pickup the network's latency
twice, and what sets the pickup is how many of them lie between an enqueue's commit and its
handler's start. A worker (4 threads) runs in this process over a fresh store; it and the
enqueuer reach the server through a TCP proxy that holds every chunk ``--latency-ms`` before it
goes on, in each direction (``tests/support/faultproxy.py``). One full-guard job (lease, lock,
operation record, one ``ctx.db_step``) is enqueued every 40 ms; for each, the time from the
enqueue call's return to its handler's start. The same run without the proxy comes first, and
the ratio of the two is printed.
"""

from __future__ import annotations

import argparse
import platform
import tempfile
import threading
import time
from pathlib import Path

from tests.support.faultproxy import FaultProxy

from bench.measure import load
from bench.pgdb import scratch_database, server_settings
from bench.stores import BenchStore
from jobguard.diagnostics.durations import percentile
from jobguard.worker import Worker

PACE_S = 0.04


def pickups_ms(url: str, jobs: int, latency_ms: float) -> list[float]:
    """Enqueue ``jobs`` full-guard jobs one at a time, through a proxy adding ``latency_ms``
    each way (none at 0); each one's enqueue return to handler start, in ms."""
    store = BenchStore("postgres", url, Path(tempfile.mkdtemp()), "pickup")
    proxy = FaultProxy() if latency_ms else None
    if proxy is not None:
        proxy.latency(latency_ms / 1e3)
    module = load("bench.apps", proxy.url_for(store.url) if proxy else store.url)
    worker = Worker(module.app, queues=["full"], concurrency=4, install_signal_handlers=False)
    running = threading.Thread(target=worker.run, daemon=True)
    running.start()
    returned: dict[int, float] = {}
    try:
        module.full.enqueue(n=-1, t=time.time())  # the worker's connections open
        time.sleep(1.0)
        for n in range(jobs):
            module.full.enqueue(n=n, t=time.time())
            returned[n] = time.time()
            time.sleep(PACE_S)
        deadline = time.monotonic() + 30
        while store.completed() < jobs + 1 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        worker.stop()
        running.join(10)
        module.app.close()
        if proxy is not None:
            proxy.close()
    started = dict(store.rows("SELECT n, started_at FROM bench_effects WHERE n >= 0"))
    return sorted((started[n] - returned[n]) * 1e3 for n in returned if n in started)


def summary(label: str, values: list[float]) -> str:
    """One line: how many, and p50 / p90 / p99 in ms."""
    cuts = " / ".join(f"{percentile(values, q):.2f}" for q in (50, 90, 99))
    return f"{label:28} {len(values):4} jobs   p50 / p90 / p99 {cuts} ms"


def main() -> None:
    """Measure the pickup directly and across the proxy; print both and their ratio."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--latency-ms", type=float, default=0.5, help="added each way")
    parser.add_argument("--jobs", type=int, default=200)
    args = parser.parse_args()
    if args.latency_ms <= 0 or args.jobs < 1:
        parser.error("--latency-ms must be above 0 and --jobs at least 1")
    with scratch_database() as url:
        print(f"machine: {platform.machine()}, Python {platform.python_version()}; ", end="")
        print(server_settings(url))
        print(f"full-guard jobs, one every {PACE_S * 1e3:.0f} ms, 1 worker process x 4 threads")
        direct = pickups_ms(url, args.jobs, 0.0)
        print(summary("direct", direct))
        proxied = pickups_ms(url, args.jobs, args.latency_ms)
        print(summary(f"{args.latency_ms:g} ms each way", proxied))
    ratio = percentile(proxied, 50) / percentile(direct, 50)
    print(f"pickup p50 across the network / direct: {ratio:.2f}x")


if __name__ == "__main__":
    main()
