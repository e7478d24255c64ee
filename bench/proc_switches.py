"""Context switches and CPU of running processes, summed over all their threads, in a window.

Usage (beside a running bench, on the same host)::

    python -m bench.drains --shapes writes:16 --jobs 40000 &
    python -m bench.proc_switches --match 'jobguard.cli.main' --after-s 6 --window-s 4

Waits for a process whose command line contains ``--match`` to start, then ``--after-s``
seconds more (past the workers' start), then reads, for every such process and every process
it started (a worker pool's children), each thread's voluntary and involuntary context switches
and its CPU time from ``/proc`` at the start and the end of a ``--window-s`` window, and prints
the differences, with the processes it summed. Divided by the jobs done in the window (the
rate the bench reports times the window), they are per job: what :mod:`bench.thread_switches`
reads thread by thread for one in-process worker, here for worker processes run as a deployment
runs them, or for any other command (another queue's workers, the floor bench).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")


def matching(pattern: str) -> list[int]:
    """The ids of this host's processes whose command line contains ``pattern`` (not this one),
    and of the processes they started, and so on down."""
    parents: dict[int, int] = {}
    found: set[int] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            parents[int(entry.name)] = int(
                (entry / "stat").read_text().rsplit(")", 1)[1].split()[1]
            )
        except (OSError, IndexError, ValueError):
            continue
        if pattern in command:
            found.add(int(entry.name))
    grown = True
    while grown:
        children = {pid for pid, parent in parents.items() if parent in found} - found
        grown = bool(children)
        found |= children
    return sorted(found)


def tally(pids: list[int]) -> tuple[int, int, float]:
    """(voluntary switches, involuntary switches, CPU seconds) of all threads of ``pids``."""
    voluntary = involuntary = 0
    ticks = 0
    for pid in pids:
        try:
            tasks = list(Path(f"/proc/{pid}/task").iterdir())
        except OSError:
            continue  # gone
        for task in tasks:
            try:
                status = (task / "status").read_text()
                stat = (task / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            for line in status.splitlines():
                if line.startswith("voluntary_ctxt_switches:"):
                    voluntary += int(line.split()[1])
                elif line.startswith("nonvoluntary_ctxt_switches:"):
                    involuntary += int(line.split()[1])
            ticks += int(stat[11]) + int(stat[12])  # utime, stime
    return voluntary, involuntary, ticks / TICK


def main() -> None:
    """Sample the matching processes over one window and print what they did in it."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--match", required=True, help="text of the processes' command lines")
    parser.add_argument("--after-s", type=float, default=6.0)
    parser.add_argument("--window-s", type=float, default=4.0)
    args = parser.parse_args()
    waited_until = time.monotonic() + 600
    while not matching(args.match):
        if time.monotonic() > waited_until:
            raise SystemExit(f"no process's command line contains {args.match!r}")
        time.sleep(0.2)
    time.sleep(args.after_s)
    pids = matching(args.match)
    before = tally(pids)
    time.sleep(args.window_s)
    after = tally(pids)
    voluntary, involuntary, cpu = (a - b for a, b in zip(after, before, strict=True))
    print(
        f"{len(pids)} processes matching {args.match!r} over {args.window_s:g} s: "
        f"voluntary switches {voluntary:.0f}, involuntary {involuntary:.0f}, CPU {cpu:.2f} s"
    )


if __name__ == "__main__":
    main()
