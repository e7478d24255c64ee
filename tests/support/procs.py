"""Start, signal and reap real worker processes for chaos tests."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support import stores

REPO_ROOT = Path(__file__).resolve().parents[2]
# Room for a worker's thread or process to be scheduled on a loaded machine, added to a time
# bound a test asserts (kept far below a lease length, so an expiry could not pass the bound).
SCHEDULING_SLACK_S = 1.0


def clean_env() -> dict[str, str]:
    """This process's environment without JOBGUARD_* settings, for a child process."""
    return {k: v for k, v in os.environ.items() if not k.startswith("JOBGUARD_")}


def entry_point() -> list[str]:
    """The installed ``jobguard`` console script next to this interpreter, else ``-m``."""
    script = Path(sys.executable).with_name("jobguard")
    return [str(script)] if script.exists() else [sys.executable, "-m", "jobguard.cli.main"]


class WorkerProcess:
    """A worker running in its own interpreter, started by :func:`spawn_worker`."""

    def __init__(self, popen: subprocess.Popen[str]) -> None:
        self.popen = popen

    @property
    def pid(self) -> int:
        """The operating system process id."""
        return self.popen.pid

    def wait_ready(self, timeout_s: float = 20.0) -> None:
        """Block until the worker printed READY (it is about to fetch)."""
        assert self.popen.stdout is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            line = self.popen.stdout.readline()
            if line.startswith("READY"):
                return
            if not line and self.popen.poll() is not None:
                raise RuntimeError(f"worker exited early with {self.popen.returncode}")
        raise TimeoutError("worker did not become ready")

    def signal(self, signum: int) -> None:
        """Send a signal (SIGKILL, SIGSTOP, SIGCONT, SIGTERM...)."""
        if self.popen.poll() is None:
            os.kill(self.popen.pid, signum)

    def wait(self, timeout_s: float = 30.0) -> int:
        """Wait for the process to exit; return its exit code (negative: killed by signal)."""
        return self.popen.wait(timeout=timeout_s)

    def output(self) -> str:
        """What the process printed (after it exited)."""
        assert self.popen.stdout is not None
        return self.popen.stdout.read()

    def pause_between_writes(self, url: str) -> None:
        """SIGSTOP the worker at a moment it is inside no transaction of the store.

        SQLite locks the whole file for a write, and a PostgreSQL transaction holds its row
        locks, so a process frozen inside a transaction (a heartbeat, say) would block other
        workers: a different fault from "a worker paused while its job runs". The pause is
        retaken until it falls between two transactions.
        """
        for _ in range(200):
            self.signal(signal.SIGSTOP)
            wait_until(lambda: all_threads_stopped(self.pid), timeout_s=10, interval_s=0.001)
            if outside_transactions(url, self.pid):
                return
            self.signal(signal.SIGCONT)
            time.sleep(0.005)
        raise AssertionError("the worker was inside a write transaction at every pause")

    def kill(self) -> None:
        """SIGKILL (after SIGCONT, in case it is stopped), reap, and close the output pipe.

        Read :meth:`output` before this: an unclosed pipe is a ``ResourceWarning``, which the
        suite turns into an error.
        """
        if self.popen.poll() is None:
            os.kill(self.popen.pid, signal.SIGCONT)
            self.popen.kill()
        self.popen.wait(timeout=10)
        if self.popen.stdout is not None:
            self.popen.stdout.close()


def spawn_worker(
    url: str,
    app_module: str,
    *,
    queues: list[str] | None = None,
    concurrency: int = 1,
    prefetch: int = 0,
    grace_s: float = 5.0,
    worker_id: str | None = None,
    burst: bool = False,
    heartbeat: bool = True,
    env: dict[str, str] | None = None,
) -> WorkerProcess:
    """Start ``tests.support.run_worker`` in a new interpreter against the store at ``url``."""
    command = [
        sys.executable,
        "-m",
        "tests.support.run_worker",
        "--url",
        url,
        "--app",
        app_module,
        "--queues",
        ",".join(queues or []),
        "--concurrency",
        str(concurrency),
        "--prefetch",
        str(prefetch),
        "--grace-s",
        str(grace_s),
    ]
    if worker_id:
        command += ["--worker-id", worker_id]
    if burst:
        command.append("--burst")
    if not heartbeat:
        command.append("--no-heartbeat")
    process_env = clean_env()
    process_env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + process_env.get("PYTHONPATH", "")
    process_env.update(env or {})
    popen = subprocess.Popen(
        command,
        cwd=REPO_ROOT,
        env=process_env,
        stdout=subprocess.PIPE,
        stderr=None,
        text=True,
    )
    return WorkerProcess(popen)


@contextmanager
def workers(*procs: WorkerProcess) -> Iterator[tuple[WorkerProcess, ...]]:
    """Make sure every process is killed and reaped, whatever the test did."""
    try:
        yield procs
    finally:
        for proc in procs:
            proc.kill()


def wait_until(
    predicate: Callable[[], bool], timeout_s: float = 20.0, interval_s: float = 0.02
) -> None:
    """Poll ``predicate`` until true; raise ``TimeoutError`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval_s)
    raise TimeoutError(f"condition not met within {timeout_s}s")


def all_threads_stopped(pid: int) -> bool:
    """Whether every thread of ``pid`` has entered the SIGSTOP group stop (Linux ``/proc``)."""
    states = []
    for stat in Path(f"/proc/{pid}/task").glob("*/stat"):
        try:
            # The state follows the parenthesised command name, which may contain spaces.
            states.append(stat.read_text().rsplit(")", 1)[1].split()[0])
        except (FileNotFoundError, IndexError):
            continue
    return bool(states) and all(state in ("T", "t") for state in states)


def outside_transactions(url: str, pid: int) -> bool:
    """Whether worker process ``pid`` holds no transaction open on the store right now."""
    if stores.kind_of(url) == "sqlite":
        return store_is_writable(stores.sqlite_file(url))
    # The PostgreSQL driver names its sessions after the process, for operators and for this.
    busy = stores.query(
        url,
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s AND state <> 'idle'",
        [f"jobguard:{pid}"],
    )
    return bool(busy[0][0] == 0)


def store_is_writable(db_path: str | Path, timeout_s: float = 0.05) -> bool:
    """Whether a write transaction can start on the SQLite store within ``timeout_s``."""
    conn = sqlite3.connect(db_path, timeout=timeout_s, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("ROLLBACK")
        return True
    except sqlite3.OperationalError:
        return False
    finally:
        conn.close()


def run_cli(
    *args: str, env: dict[str, str] | None = None, cwd: Path = REPO_ROOT
) -> subprocess.CompletedProcess[str]:
    """Run the real ``jobguard`` executable once and capture what it printed."""
    return subprocess.run(
        [*entry_point(), *args],
        cwd=cwd,
        env=clean_env() if env is None else env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
