"""Actors outside the workers: a support agent who locks orders, and the process freezer.

* :class:`BackOffice` holds ``order:{id}`` with ``app.lock()`` (G3) while the order's fulfilment
  first arrives, as a support agent editing the order would: the job is deferred, not failed and
  not charged an attempt (G3.4), and runs once the agent lets go.
* :class:`Freezer` answers a worker's ``FREEZE`` request: it stops the whole process (SIGSTOP),
  waits until the process's lock on the order has expired, lets the support agent take the lock
  (a newer fence), and resumes the process. The frozen worker's next write carries the old fence
  and is refused by the store (G3.5). In ``--unsafe`` there is no lock: it just freezes the
  process longer than its lease.
* :class:`EventLog` writes what these actors did into ``demo_events``, for the report.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

from jobguard.app import App
from jobguard.backends.sqlite import SQLiteBackend
from jobguard.demo import shop
from jobguard.demo.settings import DemoSettings
from jobguard.exceptions import LockBusyError, StoreUnavailableError
from jobguard.models import LockGrant

BACK_OFFICE_LOCK_TTL_S = 2.0
MAX_HOLD_S = 10.0
TAKEOVER_HOLD_S = 0.2
MAX_FREEZE_S = 3.0
PROBE_TIMEOUT_S = 0.2
STOP_TRIES = 20


class EventLog:
    """Thread-safe writer of ``demo_events`` rows."""

    def __init__(self, db_path: str | Path) -> None:
        self._conn = shop.connect(db_path)
        self._lock = threading.Lock()

    def record(
        self,
        kind: str,
        *,
        order_id: int | None = None,
        worker: str | None = None,
        detail: str | None = None,
    ) -> None:
        """Append one event (its own transaction)."""
        with self._lock:
            shop.record_event(self._conn, kind, order_id=order_id, worker=worker, detail=detail)

    def close(self) -> None:
        """Close the connection."""
        with self._lock:
            self._conn.close()


class BackOffice:
    """A support agent holding some orders locked until their fulfilment has been deferred.

    :meth:`hold` runs on the webhook thread, :meth:`poll` on the supervisor's loop.
    """

    def __init__(self, app: App, db_path: str | Path, events: EventLog) -> None:
        self._app = app
        self._events = events
        self._held: dict[int, tuple[contextlib.AbstractContextManager[LockGrant], float]] = {}
        self._guard = threading.Lock()
        self._conn = shop.connect(db_path)

    @property
    def holding(self) -> bool:
        """True while some order is still held."""
        with self._guard:
            return bool(self._held)

    def hold(self, order_id: int) -> None:
        """Lock the order now (renewed in the background until released)."""
        manager = self._app.lock(f"order:{order_id}", ttl_s=BACK_OFFICE_LOCK_TTL_S)
        grant = manager.__enter__()
        with self._guard:
            self._held[order_id] = (manager, time.monotonic())
        self._events.record("back_office_hold", order_id=order_id, detail=f"fence {grant.fence}")

    def poll(self) -> None:
        """Let go of the orders whose fulfilment was deferred (or that were held too long)."""
        with self._guard:
            held = list(self._held.items())
        for order_id, (manager, since) in held:
            deferred = self._conn.execute(
                shop.Q["deferred_attempt"], {"operation_key": f"fulfill-order:{order_id}"}
            ).fetchone()
            if deferred is not None or time.monotonic() - since > MAX_HOLD_S:
                manager.__exit__(None, None, None)
                with self._guard:
                    del self._held[order_id]

    def close(self) -> None:
        """Release whatever is still held."""
        with self._guard:
            held, self._held = list(self._held.values()), {}
        for manager, _ in held:
            with contextlib.suppress(Exception):
                manager.__exit__(None, None, None)
        self._conn.close()


class Freezer:
    """Freezes a worker process on request, once per planned order; see the module docstring."""

    def __init__(self, settings: DemoSettings, events: EventLog) -> None:
        self._settings = settings
        self._events = events
        # Its own store handle with a bounded wait: taking over a lock must never hang a freeze
        # (a frozen worker is stopped outside any transaction, so 2 s is plenty).
        self._app = App(backend=SQLiteBackend(settings.db_path, busy_timeout_s=2.0))
        self._frozen: set[int] = set()
        self._active = 0
        self._guard = threading.Lock()

    @property
    def active(self) -> bool:
        """True while some worker is frozen or being thawed."""
        with self._guard:
            return self._active > 0

    def freeze(
        self, process: subprocess.Popen[str], worker: str, order_id: int, thaw: Callable[[], None]
    ) -> None:
        """Freeze ``process`` for ``order_id`` unless that order was frozen already; then thaw."""
        with self._guard:
            first = order_id not in self._frozen
            if first:
                self._frozen.add(order_id)
                self._active += 1
        if not first:
            thaw()
            return
        try:
            frozen = self._freeze(process, worker, order_id, thaw)
        finally:
            with self._guard:
                self._active -= 1
        if not frozen:
            with self._guard:
                self._frozen.discard(order_id)  # a later delivery of the order asks again

    def _freeze(
        self, process: subprocess.Popen[str], worker: str, order_id: int, thaw: Callable[[], None]
    ) -> bool:
        conn = shop.connect(self._settings.db_path, busy_timeout_s=PROBE_TIMEOUT_S)
        try:
            if process.poll() is not None or not _stop_outside_transaction(process.pid, conn):
                thaw()
                return False
            resumed = False

            def resume() -> None:
                nonlocal resumed
                if not resumed:
                    resumed = True
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(process.pid, signal.SIGCONT)
                    thaw()

            started = time.monotonic()
            outcome = ""
            try:
                if self._settings.unsafe:
                    time.sleep(self._settings.freeze_s)
                else:
                    outcome = self._take_over(conn, f"order:{order_id}", resume)
            finally:
                resume()
            frozen_s = time.monotonic() - started
        finally:
            conn.close()
        self._events.record(
            "worker_frozen", order_id=order_id, worker=worker, detail=f"{frozen_s:.2f}s"
        )
        if outcome.startswith("fence"):
            self._events.record("lock_taken_over", order_id=order_id, worker=worker, detail=outcome)
        elif outcome:
            self._events.record("lock_not_taken", order_id=order_id, worker=worker, detail=outcome)
        return True

    def _take_over(
        self, conn: sqlite3.Connection, resource: str, resume: Callable[[], None]
    ) -> str:
        """Wait for the frozen owner's lock to expire, take it, resume the owner, let go.

        Returns ``"fence N"`` for the fence taken, or why the lock could not be taken.
        """
        deadline = time.monotonic() + MAX_FREEZE_S
        while time.monotonic() < deadline and not _expired(conn, resource):
            time.sleep(0.01)
        try:
            with self._app.lock(resource, ttl_s=self._settings.lock_ttl_s, renew=False) as grant:
                resume()  # the owner wakes up to a newer fence
                time.sleep(TAKEOVER_HOLD_S)
                return f"fence {grant.fence}"
        except (LockBusyError, StoreUnavailableError) as exc:
            return f"{type(exc).__name__}: {exc}"

    def close(self) -> None:
        """Close connections."""
        self._app.close()


def _stop_outside_transaction(pid: int, conn: sqlite3.Connection) -> bool:
    """SIGSTOP ``pid`` at a moment it holds no write transaction on the database.

    A process frozen inside a write would block every other writer until it is resumed. So:
    stop it, check that the write lock can be taken (a stopped process cannot take it later),
    and if not, let it run a few milliseconds to commit and try again.
    """
    for _ in range(STOP_TRIES):
        try:
            os.kill(pid, signal.SIGSTOP)
        except ProcessLookupError:
            return False
        if not _wait_stopped(pid):
            return False
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("ROLLBACK")
            return True
        except sqlite3.OperationalError:
            pass
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
        time.sleep(0.005)
    return False


def _wait_stopped(pid: int, timeout_s: float = 1.0) -> bool:
    """Wait until every thread of ``pid`` is stopped: SIGSTOP takes effect asynchronously."""
    deadline = time.monotonic() + timeout_s
    tasks = Path(f"/proc/{pid}/task")
    while time.monotonic() < deadline:
        try:
            states = [
                (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
                for entry in tasks.iterdir()
            ]
        except (OSError, IndexError):
            return False  # gone, or no /proc (then SIGSTOP is all we can do)
        if states and all(state in ("T", "t") for state in states):
            return True
        time.sleep(0.001)
    return False


def _expired(conn: sqlite3.Connection, resource: str) -> bool:
    """Has the lock on ``resource`` lapsed (by the store's clock, the host clock)?"""
    try:
        row = conn.execute(shop.Q["lock_state"], {"resource": resource}).fetchone()
    except sqlite3.Error:
        return False
    return row is None or row["owner"] is None or row["expires_at"] <= time.time()
