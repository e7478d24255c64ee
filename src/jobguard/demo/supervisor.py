"""The worker processes: start ``workers`` of them, replace the ones that die, stop them all.

A worker that SIGKILLed itself (a planned crash) is noted in ``demo_events`` and replaced by a
fresh process in the same slot. Each process's stdout is read on its own thread, which answers
the process's ``FREEZE`` requests through the :class:`~jobguard.demo.backoffice.Freezer`.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from typing import IO

from jobguard.demo.backoffice import EventLog, Freezer
from jobguard.demo.sabotage import FREEZE, THAW
from jobguard.demo.settings import DemoFiles, DemoSettings
from jobguard.exceptions import JobGuardError

STOP_GRACE_S = 10.0
MAX_UNEXPECTED_EXITS_PER_WORKER = 3


class WorkerSlot:
    """One of the ``workers`` places; holds its current process and restarts it when it dies."""

    def __init__(self, index: int, settings_path: str, log: IO[str], freezer: Freezer) -> None:
        self.index = index
        self.generation = 0
        self._settings_path = settings_path
        self._log = log
        self._freezer = freezer
        self.process: subprocess.Popen[str] | None = None
        self.name = ""

    def start(self) -> None:
        """Start a fresh worker process in this slot."""
        self.generation += 1
        self.name = f"worker-{self.index}.{self.generation}"
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "jobguard.demo.worker",
                "--settings",
                self._settings_path,
                "--worker-id",
                self.name,
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
        )
        reader = threading.Thread(
            target=self._read,
            args=(self.process, self.name),
            name=f"{self.name}-stdout",
            daemon=True,
        )
        reader.start()

    def _read(self, process: subprocess.Popen[str], name: str) -> None:
        """Answer FREEZE requests from this process's stdout until it exits."""
        assert process.stdout is not None
        for line in process.stdout:
            parts = line.split()
            if len(parts) == 2 and parts[0] == FREEZE:
                self._freezer.freeze(process, name, int(parts[1]), lambda: _thaw(process))

    def exited(self) -> int | None:
        """The exit code if the current process has ended (negative: killed by that signal)."""
        return None if self.process is None else self.process.poll()


def _thaw(process: subprocess.Popen[str]) -> None:
    try:
        assert process.stdin is not None
        process.stdin.write(f"{THAW}\n")
        process.stdin.flush()
    except (BrokenPipeError, OSError, ValueError):
        pass  # it died while frozen: nothing to resume


class Supervisor:
    """Keeps the worker processes alive until told to stop; see the module docstring."""

    def __init__(self, settings: DemoSettings, files: DemoFiles, events: EventLog) -> None:
        self._events = events
        self._log_path = files.workers_log
        self._log = files.workers_log.open("a", encoding="utf-8")
        self._unexpected_exits = 0
        self._max_unexpected_exits = MAX_UNEXPECTED_EXITS_PER_WORKER * settings.workers
        self.freezer = Freezer(settings, events)
        self.slots = [
            WorkerSlot(i, str(files.settings), self._log, self.freezer)
            for i in range(1, settings.workers + 1)
        ]

    def start(self) -> None:
        """Start every worker process."""
        for slot in self.slots:
            slot.start()

    def poll(self) -> None:
        """Replace every worker process that has died, noting how it died."""
        for slot in self.slots:
            code = slot.exited()
            if code is None:
                continue
            kind = "worker_killed" if code == -signal.SIGKILL else "worker_exited"
            self._events.record(kind, worker=slot.name, detail=f"exit code {code}")
            if kind == "worker_exited":
                # Planned crashes are SIGKILLs; anything else is a broken worker, and restarting
                # it forever would only hide that.
                self._unexpected_exits += 1
                if self._unexpected_exits > self._max_unexpected_exits:
                    raise JobGuardError(
                        f"demo worker processes keep exiting (last: exit code {code}); "
                        f"see {self._log_path}"
                    )
            slot.start()

    def stop(self) -> None:
        """SIGTERM every worker (graceful), then SIGKILL what is still alive after the grace."""
        for slot in self.slots:
            if slot.process is not None and slot.process.poll() is None:
                slot.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        for slot in self.slots:
            if slot.process is None:
                continue
            try:
                slot.process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                slot.process.send_signal(signal.SIGCONT)
                slot.process.kill()
                slot.process.wait()
        self.freezer.close()
        self._log.close()
