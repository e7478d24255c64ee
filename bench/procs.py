"""Worker processes for the benches: start, stop, wait on conditions, and their CPU time."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from bench.measure import Cpu

REPO_ROOT = Path(__file__).resolve().parents[1]
_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def bench_env(**extra: str) -> dict[str, str]:
    """This environment plus the repository on the path (after what it held: a paired run
    puts another checkout's jobguard first) and ``extra``."""
    path = [os.environ.get("PYTHONPATH", ""), str(REPO_ROOT)]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(part for part in path if part), **extra}


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
    """Poll ``condition`` every 250 ms until true; fail the bench after ``timeout_s``.

    Nothing is timed by this poll: the figures come from the rows' own timestamps. Each poll
    opens a connection and counts rows on the cores the measured run uses (the count took 2 ms
    of server time per poll in a 10,000-job drain), so it polls every 250 ms, not 50.
    """
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.25)


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


def tree(pids: Sequence[int]) -> list[int]:
    """``pids`` and all their descendants (alive now)."""
    found: list[int] = []
    pending = list(pids)
    while pending:
        pid = pending.pop()
        found.append(pid)
        try:
            pending.extend(children(pid))
        except OSError:
            continue  # exited meanwhile
    return found


def database_backends(database_url: str) -> list[int]:
    """Server processes of every other connection to the database at ``database_url``."""
    import psycopg

    with psycopg.connect(database_url, autocommit=True) as conn:
        found = conn.execute(
            "SELECT pid FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchall()
    return [int(row[0]) for row in found]


def total_cpu_s(pids: Sequence[int]) -> float:
    """CPU seconds used so far by ``pids`` together (those that exited count 0)."""
    total = 0.0
    for pid in pids:
        try:
            total += cpu_seconds(pid)
        except OSError:
            continue
    return total


def redis_server_pid() -> int | None:
    """The local redis-server's process id, if one runs."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() == "redis-server":
                    return int(entry.name)
            except OSError:
                continue
    return None


def drain_cpu(
    workers: Sequence[int], database_url: str | None, broker_before: float | None = None
) -> Cpu:
    """What the drain cost so far: ``workers`` (and their children), the database's backends,
    and the Redis server since it used ``broker_before`` CPU seconds."""
    database_s = total_cpu_s(database_backends(database_url)) if database_url else 0.0
    broker_s = 0.0
    if broker_before is not None and (pid := redis_server_pid()) is not None:
        broker_s = cpu_seconds(pid) - broker_before
    return Cpu(total_cpu_s(tree(workers)), database_s, broker_s)
