"""Drain throughput and enqueue-to-start latency on the embedded SQLite backend.

Usage (from the repository root, in the project's virtualenv)::

    python -m bench.sqlite_throughput                 # 20,000 jobs, 2 worker processes
    python -m bench.sqlite_throughput --jobs 5000 --mode plain

For each mode ("plain": a no-op task; "guarded": lease + lock + operation record + one step +
atomic finish) it prefills the queue, starts worker processes through the real ``jobguard worker``
command in burst mode and reports jobs/s over the span between the first delivery and the last
finish, taken from the attempt log. Then a steady phase: workers idle-poll while a producer
enqueues one job at a time at a fixed rate, and the enqueue-to-start latency (job created_at to
its first delivery) is reported as p50/p99. The guard's cost is printed as a ratio against plain.
"""

from __future__ import annotations

import argparse
import importlib
import os
import platform
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from bench.procs import jobguard_command
from jobguard.diagnostics.durations import percentile

REPO_ROOT = Path(__file__).resolve().parents[1]
QUEUE_OF = {"plain": "plain", "guarded": "guarded"}
TASK_OF = {"plain": "noop", "guarded": "guarded"}


@dataclass
class Result:
    """Figures of one mode."""

    mode: str
    jobs: int
    drain_s: float
    jobs_per_s: float
    p50_ms: float
    p99_ms: float


def start_workers(
    db: Path, queue: str, count: int, concurrency: int, burst: bool
) -> list[subprocess.Popen[bytes]]:
    """Start ``count`` worker processes against ``db``."""
    env = {**os.environ, "JOBGUARD_BENCH_DB": str(db), "PYTHONPATH": str(REPO_ROOT)}
    return [
        subprocess.Popen(
            jobguard_command(queue, concurrency, burst),
            cwd=REPO_ROOT,
            env=env,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(count)
    ]


def open_app(db: Path) -> ModuleType:
    """Import the bench app against ``db`` (fresh module state per call)."""
    os.environ["JOBGUARD_BENCH_DB"] = str(db)
    import bench.apps  # here, not at the top: the app opens the store named in the environment

    return importlib.reload(bench.apps)


def drain(
    mode: str, jobs: int, workers: int, concurrency: int, folder: Path
) -> tuple[float, float, float]:
    """Prefill ``jobs`` jobs and drain them.

    Returns:
        The drain span in seconds and jobs/s (first delivery to last finish, from the attempt
        log), and the wall time in seconds including worker process start-up.
    """
    db = folder / f"drain-{mode}.db"
    module = open_app(db)
    task = getattr(module, TASK_OF[mode])
    for start in range(0, jobs, 1000):
        task.enqueue_many({"n": n} for n in range(start, min(jobs, start + 1000)))
    module.app.close()
    wall_started = time.perf_counter()
    procs = start_workers(db, QUEUE_OF[mode], workers, concurrency, burst=True)
    for proc in procs:
        proc.wait()
    wall_s = time.perf_counter() - wall_started
    with sqlite3.connect(db) as conn:
        done = conn.execute("SELECT count(*) FROM jobs WHERE status = 'completed'").fetchone()[0]
        first, last = conn.execute("SELECT min(started_at), max(ended_at) FROM attempts").fetchone()
    if done != jobs:
        raise SystemExit(f"{mode}: only {done} of {jobs} jobs completed")
    span = last - first
    return span, jobs / span, wall_s


def latency(
    mode: str, rate_per_s: int, seconds: float, workers: int, concurrency: int, folder: Path
) -> tuple[float, float]:
    """Enqueue one job at a time at ``rate_per_s`` with idle workers; return p50/p99 in ms."""
    db = folder / f"latency-{mode}.db"
    module = open_app(db)
    task = getattr(module, TASK_OF[mode])
    procs = start_workers(db, QUEUE_OF[mode], workers, concurrency, burst=False)
    time.sleep(2.0)  # let the workers start and reach their idle poll
    interval = 1.0 / rate_per_s
    count = int(rate_per_s * seconds)
    next_at = time.perf_counter()
    for n in range(count):
        task.enqueue(n=n)
        next_at += interval
        pause = next_at - time.perf_counter()
        if pause > 0:
            time.sleep(pause)
    deadline = time.monotonic() + 30
    with sqlite3.connect(db) as conn:
        while time.monotonic() < deadline:
            done = conn.execute("SELECT count(*) FROM jobs WHERE status = 'completed'").fetchone()[
                0
            ]
            if done == count:
                break
            time.sleep(0.05)
        delays = [
            (started - created) * 1000
            for created, started in conn.execute(
                "SELECT j.created_at, min(a.started_at) FROM jobs j "
                "JOIN attempts a ON a.job_id = j.id GROUP BY j.id"
            )
        ]
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    for proc in procs:
        proc.wait()
    module.app.close()
    delays.sort()
    return percentile(delays, 50), percentile(delays, 99)


def huey_drain(jobs: int, workers: int, concurrency: int, folder: Path) -> tuple[float, float]:
    """The same drain with huey (SqliteHuey, fsync) consumers; wall time until the queue is empty.

    huey has no leases: a job is removed from the queue when it is dequeued, so "empty" means
    every job was handed to a consumer thread (no-op jobs finish right after).
    """
    db = folder / "huey.db"
    os.environ["JOBGUARD_BENCH_DB"] = str(db)
    import bench.huey_app  # here, not at the top: the module opens the file named above

    module = importlib.reload(bench.huey_app)
    for n in range(jobs):
        module.noop(n)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    consumer = [
        sys.executable,
        "-m",
        "huey.bin.huey_consumer",
        "bench.huey_app.huey",
        "-w",
        str(concurrency),
        "-k",
        "thread",
        "-d",
        "0.001",
        "-q",
    ]
    started = time.perf_counter()
    procs = [
        subprocess.Popen(consumer, cwd=REPO_ROOT, env=env, stderr=subprocess.DEVNULL)
        for _ in range(workers)
    ]
    while module.huey.pending_count() > 0:
        time.sleep(0.005)
    elapsed = time.perf_counter() - started
    for proc in procs:
        proc.send_signal(signal.SIGINT)
    for proc in procs:
        proc.wait()
    return elapsed, jobs / elapsed


def main() -> None:
    """Run the benchmark and print a table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--mode", choices=["plain", "guarded", "both"], default="both")
    parser.add_argument("--rate", type=int, default=500, help="latency phase: jobs/s enqueued")
    parser.add_argument("--seconds", type=float, default=4.0, help="latency phase length")
    parser.add_argument(
        "--no-peer",
        dest="peer",
        action="store_false",
        help="skip the huey comparison (needs: pip install -e '.[bench]')",
    )
    args = parser.parse_args()
    modes = ["plain", "guarded"] if args.mode == "both" else [args.mode]
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, SQLite {sqlite3.sqlite_version}, synchronous=FULL"
    )
    print(f"workers: {args.workers} processes x {args.concurrency} threads; jobs: {args.jobs}")
    results: list[Result] = []
    walls: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="jobguard-bench-") as tmp:
        folder = Path(tmp)
        for mode in modes:
            span, rate, walls[mode] = drain(mode, args.jobs, args.workers, args.concurrency, folder)
            p50, p99 = latency(
                mode, args.rate, args.seconds, args.workers, args.concurrency, folder
            )
            results.append(Result(mode, args.jobs, span, rate, p50, p99))
            print(
                f"jobguard {mode:8s} drained {args.jobs} in {span:6.2f} s = {rate:6.0f} jobs/s "
                f"(wall incl. process start {walls[mode]:5.2f} s); enqueue-to-start at "
                f"{args.rate}/s: p50 {p50:5.1f} ms, p99 {p99:6.1f} ms",
                flush=True,
            )
        if args.peer and "plain" in walls:
            huey_s, huey_rate = huey_drain(args.jobs, args.workers, args.concurrency, folder)
            print(
                f"huey     plain    drained {args.jobs} in wall {huey_s:5.2f} s = "
                f"{huey_rate:6.0f} jobs/s (SqliteHuey, fsync=True, WAL; no leases)"
            )
            print(
                f"ratio: jobguard plain / huey (wall, same start-up) = "
                f"{huey_s / walls['plain']:.2f}x"
            )
    if len(results) == 2:
        plain, guarded = results
        print(f"guard cost: guarded/plain throughput = {guarded.jobs_per_s / plain.jobs_per_s:.2f}")


if __name__ == "__main__":
    main()
