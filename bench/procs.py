"""Worker processes for the benches: start, stop, wait on conditions, and their CPU time."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def bench_env(**extra: str) -> dict[str, str]:
    """This environment plus the repository on the path and ``extra``."""
    return {**os.environ, "PYTHONPATH": str(REPO_ROOT), **extra}


def jobguard_command(queue: str, concurrency: int, burst: bool) -> list[str]:
    """The real ``jobguard worker`` command, run by this interpreter on ``bench.apps:app``."""
    command = [
        sys.executable,
        "-c",
        "from jobguard.cli.main import main; main()",
        "--app",
        "bench.apps:app",
        "worker",
        "--queues",
        queue,
        "--concurrency",
        str(concurrency),
    ]
    return [*command, "--burst"] if burst else command


def start(
    command: Sequence[str], count: int, env: dict[str, str], log: Path
) -> list[subprocess.Popen[bytes]]:
    """Start ``count`` copies of ``command``; their stderr goes to ``log``."""
    with log.open("ab") as sink:
        return [
            subprocess.Popen(list(command), cwd=REPO_ROOT, env=env, stderr=sink)
            for _ in range(count)
        ]


def stop(procs: Sequence[subprocess.Popen[bytes]], sig: int = signal.SIGTERM) -> None:
    """Signal ``procs`` and wait for them (killed after 30 s)."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(sig)
    for proc in procs:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def wait_for(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Poll ``condition`` every 20 ms until true; fail the bench after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.02)


def children(pid: int) -> list[int]:
    """Direct child processes of ``pid`` (e.g. a dramatiq master's worker processes)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found.extend(int(c) for c in (task / "children").read_text().split())
    return found


def cpu_seconds(pid: int) -> float:
    """User + system CPU time the process has used so far (from /proc/PID/stat)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat.rsplit(")", 1)[1].split()
    # fields[0] is the state (field 3 of stat); utime and stime are fields 14 and 15.
    return (int(fields[11]) + int(fields[12])) / _TICKS_PER_S


def idle_cpu_percent(pids: Sequence[int], seconds: float) -> list[float]:
    """Each process's CPU use over the next ``seconds``, in % of one core."""
    before = [cpu_seconds(pid) for pid in pids]
    time.sleep(seconds)
    after = [cpu_seconds(pid) for pid in pids]
    return [100.0 * (b - a) / seconds for a, b in zip(before, after, strict=True)]
