"""The store clock of a host: time since boot plus an offset every process reads from the file.

SQLite has no server whose clock all workers could ask, but its processes share one host. Time
since boot (``CLOCK_BOOTTIME``) is one clock for every process of the host and never steps when
the wall clock is set (NTP, a resumed VM, a wrong ``date``); the first process of each boot
records ``wall clock - time since boot`` in the file, and every process then reads time as
``time since boot + that offset``. A process whose own wall clock is off by a minute therefore
sees the same lease expiries as every other one.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from jobguard.core.boottime import since_boot_s

_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def boot_id() -> str:
    """This boot's identity (Linux); elsewhere one fixed value, so the first offset stays."""
    try:
        return _BOOT_ID.read_text().strip()
    except OSError:
        return "unknown-boot"


class HostClock:
    """``since_boot_s() + offset_s``; see the module docstring."""

    def __init__(self, offset_s: float) -> None:
        self.offset_s = offset_s

    def __call__(self) -> float:
        return since_boot_s() + self.offset_s


def host_clock(conn: sqlite3.Connection) -> HostClock:
    """Read this boot's offset from the file, recording it first if this process is first."""
    boot = boot_id()
    known = conn.execute(
        "SELECT offset_s FROM jobguard_clock WHERE boot_id = ?", (boot,)
    ).fetchone()
    if known is not None:  # the usual case: no write lock taken
        return HostClock(float(known[0]))
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute(
            "INSERT INTO jobguard_clock (boot_id, offset_s) VALUES (?, ?) "
            "ON CONFLICT (boot_id) DO NOTHING",
            (boot, time.time() - since_boot_s()),
        )
        row = conn.execute(
            "SELECT offset_s FROM jobguard_clock WHERE boot_id = ?", (boot,)
        ).fetchone()
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return HostClock(float(row[0]))
