"""Where a busy worker's threads spend their CPU and how often they give it up, per job.

Usage (from the repository root, PostgreSQL on 127.0.0.1:5432)::

    python -m bench.thread_switches                        # writes and plain jobs, 16 threads
    python -m bench.thread_switches --kinds writes --concurrency 4 --jobs 6000

In a throw-away database, one ``Worker`` runs in this process on a prefilled queue of
``--jobs`` jobs of one kind (:mod:`bench.apps`: ``writes``, the full guard with the business
row by ``ctx.db_writes``; ``plain``, no guard and no write). After the first second, each
thread's voluntary and involuntary context switches and CPU time are read from ``/proc`` twice,
``--window-s`` apart, and divided by the jobs fetched in between; then the worker stops.
Threads are grouped by name (the handlers, the fetch loop, the settler, the heartbeat). A
voluntary switch is a thread blocking: on I/O, on a lock, or on the GIL another thread holds.
The output is also written to ``bench/results/thread-switches-DATE.txt``.
"""

from __future__ import annotations

import argparse
import re
import tempfile
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from bench.compare import results_run
from bench.measure import load
from bench.stores import BenchStore


@dataclass
class Sample:
    """One thread's counters read from ``/proc/self/task/TID``."""

    group: str
    voluntary: int
    involuntary: int
    cpu_ns: int


def group_of(name: str) -> str:
    """A thread's group: its name without the numbers threading adds (the worker's fetch loop
    is the thread that called ``run``, here the main one)."""
    if name == "MainThread":
        return "the fetch loop (MainThread)"
    return re.sub(r"[-_ ]?\d+$", "", re.sub(r"\s*\(.*\)$", "", name)) or name


def sample() -> dict[int, Sample]:
    """Every live Python thread's counters, by native thread id."""
    found: dict[int, Sample] = {}
    for thread in threading.enumerate():
        task = Path(f"/proc/self/task/{thread.native_id}")
        try:
            status = (task / "status").read_text()
            cpu_ns = int((task / "schedstat").read_text().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            continue  # ended meanwhile
        counts = dict(re.findall(r"^(\w+_ctxt_switches):\s+(\d+)$", status, re.MULTILINE))
        found[thread.native_id or 0] = Sample(
            group_of(thread.name),
            int(counts["voluntary_ctxt_switches"]),
            int(counts["nonvoluntary_ctxt_switches"]),
            cpu_ns,
        )
    return found


def measure(url: str, kind: str, jobs: int, concurrency: int, window_s: float) -> list[str]:
    """Drain ``jobs`` jobs of ``kind`` in this process; one line per thread group."""
    store = BenchStore("postgres", url, Path(tempfile.mkdtemp(prefix="jobguard-")), kind)
    module = load("bench.apps", store.url)
    task = module.noop if kind == "plain" else module.full_writes
    for start in range(0, jobs, 1000):
        numbers = range(start, min(jobs, start + 1000))
        task.enqueue_many({"n": n} if kind == "plain" else {"n": n, "t": 0.0} for n in numbers)
    worker = module.app.worker([kind], concurrency=concurrency, install_signal_handlers=False)
    window: dict[str, tuple[dict[int, Sample], dict[int, Sample], int]] = {}

    running = threading.Event()

    def watch() -> None:
        time.sleep(1.0)  # past the pool's growth and the statements' first runs
        before, fetched = sample(), worker.stats.fetched
        time.sleep(window_s)
        if running.is_set():  # a window that saw the whole worker, none of it stopping
            window["it"] = (before, sample(), worker.stats.fetched - fetched)
        worker.stop()

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    running.set()
    try:
        worker.run(burst=True)
    finally:
        running.clear()
        module.app.close()
    watcher.join()
    if "it" not in window or window["it"][2] == 0:
        return [f"{kind}: the queue ran dry before the window closed; use more --jobs"]
    before, after, done = window["it"]
    totals: dict[str, list[float]] = defaultdict(lambda: [0, 0, 0.0, 0])
    for tid, now in after.items():
        then = before.get(tid)
        if then is None:
            continue
        total = totals[now.group]
        total[0] += now.voluntary - then.voluntary
        total[1] += now.involuntary - then.involuntary
        total[2] += (now.cpu_ns - then.cpu_ns) / 1000
        total[3] += 1
    lines = [f"{kind}, {concurrency} threads: {done} jobs in the {window_s:g} s window"]
    for group, (voluntary, involuntary, cpu_us, threads) in sorted(
        totals.items(), key=lambda item: -item[1][2]
    ):
        if cpu_us / done >= 0.5:
            lines.append(
                f"  {group:28} x{threads:<3} CPU {cpu_us / done:6.1f} us/job  switches: "
                f"voluntary {voluntary / done:5.2f}, involuntary {involuntary / done:5.2f} per job"
            )
    return lines


def main() -> None:
    """Measure each kind in turn and print its thread groups."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--kinds", default="writes,plain", help="writes, plain or both")
    parser.add_argument(
        "--jobs",
        type=int,
        default=20000,
        help="jobs queued per run (the run stops after the window)",
    )
    parser.add_argument("--concurrency", type=int, default=16, help="handler threads")
    parser.add_argument("--window-s", type=float, default=4.0, help="seconds measured")
    parser.add_argument("--rounds", type=int, default=1, help="times through the kinds")
    args = parser.parse_args()
    kinds = [kind.strip() for kind in args.kinds.split(",")]
    if not set(kinds) <= {"writes", "plain"}:
        parser.error(f"--kinds takes writes and plain, not {args.kinds!r}")
    command = (
        f"python -m bench.thread_switches --kinds {args.kinds} --jobs {args.jobs} "
        f"--concurrency {args.concurrency} --window-s {args.window_s:g} --rounds {args.rounds}"
    )
    with results_run("thread-switches", command) as (say, url):
        for _ in range(args.rounds):
            for kind in kinds:
                for line in measure(url, kind, args.jobs, args.concurrency, args.window_s):
                    say(line)


if __name__ == "__main__":
    main()
