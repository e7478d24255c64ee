"""What the long-running loops (worker, scheduler) share: a default name, graceful-stop signals."""

from __future__ import annotations

import contextlib
import logging
import os
import random
import signal
import socket
import threading
from collections.abc import Callable
from types import FrameType

log = logging.getLogger("jobguard.process")

_UNDONE = 0  # no signal has number 0: tells the delivery thread that the handlers are undone
RESTORE_JOIN_S = 1.0  # how long undoing waits for the signals already received to be handled


def default_process_id() -> str:
    """``host:pid:random`` — unique per process, readable in the attempt log."""
    return f"{socket.gethostname()}:{os.getpid()}:{random.randrange(16**4):04x}"


def on_stop_signals(callback: Callable[[int], None]) -> Callable[[], None]:
    """Call ``callback(signum)`` on SIGTERM and SIGINT from now on; return what undoes it.

    Only the main thread may install handlers: elsewhere this does nothing (and undoes nothing).
    The handler itself only writes the signal number to a pipe; ``callback`` runs on a thread of
    its own, one signal at a time and in order, so it may take locks (set an ``Event``, notify a
    ``Condition``). Run inside the handler, it would deadlock whenever the signal landed while
    the main thread held that same lock, inside ``Event.wait`` for instance.
    """
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)

    def handler(signum: int, frame: FrameType | None) -> None:
        # A full pipe holds stop signals not yet handled: one more would add nothing.
        with contextlib.suppress(BlockingIOError):
            os.write(write_fd, bytes([signum]))

    def deliver() -> None:
        try:
            while True:
                for signum in os.read(read_fd, 64):
                    if signum == _UNDONE:
                        return
                    try:
                        callback(signum)
                    except Exception:
                        log.exception("the handling of signal %d raised", signum)
        finally:
            os.close(read_fd)  # here, not in restore(): this thread may still be reading it

    delivery = threading.Thread(target=deliver, name="jobguard-signals", daemon=True)
    delivery.start()
    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}

    def restore() -> None:
        for sig, old in previous.items():
            signal.signal(sig, old)
        # Signals already written are handled first (the pipe keeps their order).
        os.set_blocking(write_fd, True)
        os.write(write_fd, bytes([_UNDONE]))
        os.close(write_fd)
        delivery.join(timeout=RESTORE_JOIN_S)

    return restore


def ignore_stop_signals() -> None:
    """Ignore SIGTERM and SIGINT from now on: the loop has stopped and the process is exiting.

    The interpreter resets Python-level handlers to the default action while it shuts down, so a
    late signal would otherwise turn a clean stop into death by signal.
    """
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)
