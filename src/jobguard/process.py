"""What the long-running loops (worker, scheduler) share: a default name, graceful-stop signals."""

from __future__ import annotations

import os
import random
import signal
import socket
import threading
from collections.abc import Callable
from types import FrameType


def default_process_id() -> str:
    """``host:pid:random`` — unique per process, readable in the attempt log."""
    return f"{socket.gethostname()}:{os.getpid()}:{random.randrange(16**4):04x}"


def on_stop_signals(callback: Callable[[int], None]) -> Callable[[], None]:
    """Call ``callback(signum)`` on SIGTERM and SIGINT from now on; return what undoes it.

    Only the main thread may install handlers: elsewhere this does nothing (and undoes nothing).
    The callback runs on the main thread between two bytecodes, so it should only set flags.
    """
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def handler(signum: int, frame: FrameType | None) -> None:
        callback(signum)

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}

    def restore() -> None:
        for sig, old in previous.items():
            signal.signal(sig, old)

    return restore


def ignore_stop_signals() -> None:
    """Ignore SIGTERM and SIGINT from now on: the loop has stopped and the process is exiting.

    The interpreter resets Python-level handlers to the default action while it shuts down, so a
    late signal would otherwise turn a clean stop into death by signal.
    """
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)
