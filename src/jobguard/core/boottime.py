"""This host's time since boot: one clock for every process, that never steps and counts
suspend where the platform can (``CLOCK_BOOTTIME`` on Linux; elsewhere the monotonic clock)."""

from __future__ import annotations

import time


def since_boot_s() -> float:
    """Seconds since boot, counting suspend where the platform can (it never steps)."""
    clock_id = getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC)
    return time.clock_gettime(clock_id)
