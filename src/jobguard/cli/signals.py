"""SIGTERM and SIGINT as a graceful stop, for the commands that run until stopped."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType


def stop_on_signals(stop: Callable[[], None]) -> Callable[[], None]:
    """Call ``stop()`` on SIGTERM or SIGINT from now on; return what restores the old handlers.

    Installed before a command starts serving, so a signal that comes while it sets up stops it
    gracefully instead of killing it. Off the main thread (signals cannot be handled there) it
    does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def handler(signum: int, frame: FrameType | None) -> None:
        stop()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}

    def restore() -> None:
        for sig, old in previous.items():
            signal.signal(sig, old)

    return restore
