"""An idle worker's wait for new jobs, cut short when the worker stops.

A worker with nothing to do sleeps in ``select()`` on its store's wake-up channel (a LISTEN
connection, a socket) for up to its poll interval. :meth:`WaitInterrupt.interrupt` ends that
sleep from another thread, so a stop takes effect at once and not a poll interval later.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import threading
from collections.abc import Sequence


class WaitInterrupt:
    """A self-pipe for the waits of one process (a new one after ``fork()``)."""

    def __init__(self) -> None:
        self._pair: tuple[socket.socket, socket.socket] | None = None
        self._pid = -1
        self._lock = threading.Lock()

    def wait(self, fds: Sequence[int], timeout_s: float) -> bool:
        """Block until one of ``fds`` is readable (True), ``timeout_s`` passes or
        :meth:`interrupt` is called (False); an interrupt is used up by the wait it ends."""
        pair = self._this_process()
        watched = [*fds, pair[0].fileno()] if pair is not None else list(fds)
        ready = select.select(watched, [], [], max(timeout_s, 0.0))[0]
        if pair is not None and pair[0].fileno() in ready:
            with contextlib.suppress(OSError):
                while pair[0].recv(64):
                    pass
        return any(fd in ready for fd in fds)

    def interrupt(self) -> None:
        """End this process's current wait, or the next one if none is under way (a wait
        may end early anyway: callers look again). Never raises."""
        pair = self._this_process()
        if pair is not None:
            with contextlib.suppress(OSError):  # a full buffer: an interrupt is pending
                pair[1].send(b"!")

    def close(self) -> None:
        """Close this process's pair of sockets."""
        with self._lock:
            if self._pair is not None and self._pid == os.getpid():
                for end in self._pair:
                    end.close()
            self._pair = None

    def _this_process(self) -> tuple[socket.socket, socket.socket] | None:
        with self._lock:
            if self._pair is None or self._pid != os.getpid():
                # Sockets inherited across fork() are shared with the parent: make our own.
                try:
                    pair = socket.socketpair()
                except OSError:
                    return None  # out of descriptors: waits run their full time
                for end in pair:
                    end.setblocking(False)
                self._pair, self._pid = pair, os.getpid()
            return self._pair
