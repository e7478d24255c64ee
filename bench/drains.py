"""Drains only: jobguard's real worker processes emptying a prefilled queue, nothing else.

Usage (from the repository root, after ``pip install -e '.[postgres,bench]'``)::

    python -m bench.drains --shapes full:4,full:16,retry:16 --rounds 2

Each run fills a fresh store with ``--jobs`` jobs of one kind (``plain``, ``full``: the full
guard with a ``db_step`` insert, ``retry``: the full guard with a third of the jobs failing once)
and starts ``--workers`` ``jobguard worker`` processes at the shape's thread count; it prints
the rate over the attempt log (first delivery to last finish) and the CPU per job of the workers
and of the database's server processes (``--backend sqlite``: a fresh SQLite file each run,
the workers' CPU alone). No peers and no paced pickups, so a run takes seconds:
the bench for paired runs of two commits (:mod:`bench.paired`) on a machine whose speed drifts.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import sqlite3
import subprocess
import tempfile
from pathlib import Path

import jobguard
from bench.jobguard_runs import QUEUE_OF, JobguardRuns
from bench.pgdb import scratch_database, server_settings


def shape(text: str) -> tuple[str, int]:
    """``kind:threads``, for example ``full:16``."""
    kind, _, threads = text.partition(":")
    if kind not in QUEUE_OF or not threads.isdigit() or int(threads) < 1:
        raise argparse.ArgumentTypeError(
            f"a shape is KIND:THREADS with KIND one of {', '.join(QUEUE_OF)}, not {text!r}"
        )
    return kind, int(threads)


def commit_of(checkout: Path) -> str:
    """The commit of the checkout jobguard was imported from, ``+changes`` if it has some."""
    git = ["git", "-C", str(checkout)]
    found = subprocess.run(
        [*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    )
    if found.returncode != 0:
        return "a checkout outside git"
    changed = subprocess.run(
        [*git, "status", "--porcelain", "--", "src"], capture_output=True, check=False
    )
    return found.stdout.strip() + ("+changes" if changed.stdout.strip() else "")


def main() -> None:
    """Run each shape ``--rounds`` times, in order, and print a line per run."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--jobs", type=int, default=5000, help="jobs per drain")
    parser.add_argument("--workers", type=int, default=2, help="worker processes")
    parser.add_argument(
        "--shapes",
        type=lambda text: [shape(part) for part in text.split(",")],
        default=[("full", 4), ("full", 16)],
        help="KIND:THREADS,... (kinds: plain, full, retry)",
    )
    parser.add_argument("--rounds", type=int, default=1, help="times through the shapes")
    parser.add_argument("--label", default="", help="put before every line (paired runs)")
    parser.add_argument(
        "--backend",
        choices=("postgres", "sqlite"),
        default="postgres",
        help="the store: PostgreSQL (a fresh database each run) or a fresh SQLite file",
    )
    args = parser.parse_args()
    source = commit_of(Path(jobguard.__file__).resolve().parents[2])
    with contextlib.ExitStack() as stack:
        if args.backend == "postgres":
            url: str | None = stack.enter_context(scratch_database())
            store = server_settings(url)
        else:
            url, store = None, f"SQLite {sqlite3.sqlite_version} synchronous=FULL"
        print(
            f"{args.label}jobguard {jobguard.__version__} from {source}; {platform.machine()}, "
            f"{os.cpu_count()} cores; {store}; load average at start "
            f"{os.getloadavg()[0]:.1f}",
            flush=True,
        )
        runs = JobguardRuns(args.backend, url, Path(tempfile.mkdtemp(prefix="jobguard-drains-")))
        for _ in range(args.rounds):
            for kind, threads in args.shapes:
                drained = runs.drain(kind, args.jobs, args.workers, threads)
                rate = args.jobs / drained.attempt_span_s
                print(
                    f"{args.label}{kind:5} {args.workers}x{threads:<3} {rate:7.0f} jobs/s  "
                    f"CPU per job {drained.cpu.per_job_ms(args.jobs)} ms",
                    flush=True,
                )


if __name__ == "__main__":
    main()
