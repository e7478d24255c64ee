"""Cross-process wake-ups for workers of one SQLite file on one host.

Each idle worker process binds a Unix datagram socket in a directory named after the database
file (under the system's temporary directory, so nothing is added beside the user's file); an
enqueue sends one byte to every socket there after its commit. A lost or spurious wake-up costs
nothing: workers still poll.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import socket
import tempfile
from pathlib import Path

from jobguard.backends.sql.interrupt import WaitInterrupt


def wake_dir(db_path: str) -> Path:
    """The rendezvous directory of one database file (short: socket paths are limited)."""
    digest = hashlib.blake2b(os.path.realpath(db_path).encode(), digest_size=8).hexdigest()
    return Path(tempfile.gettempdir()) / f"jobguard-wake-{digest}"


class Waker:
    """Sends and receives wake-ups for one database file."""

    def __init__(self, db_path: str) -> None:
        self._dir = wake_dir(db_path)
        self._sock: socket.socket | None = None
        self._path: Path | None = None
        self._pid = -1
        self._interrupt = WaitInterrupt()

    def interrupt(self) -> None:
        """End this process's wait (a worker stopping); never raises."""
        self._interrupt.interrupt()

    def notify(self) -> None:
        """Wake every worker waiting on this file (best effort, never raises)."""
        try:
            names = os.listdir(self._dir)
        except OSError:
            return
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sender:
            sender.setblocking(False)
            for name in names:
                path = self._dir / name
                try:
                    sender.sendto(b"!", str(path))
                except (ConnectionRefusedError, FileNotFoundError):
                    # Its worker is gone (killed): clear the way for the others.
                    with contextlib.suppress(OSError):
                        path.unlink()
                except OSError:
                    continue  # full buffer: that worker has wake-ups pending already

    def wait(self, timeout_s: float) -> bool:
        """Block until a wake-up arrives (True), ``timeout_s`` passes or :meth:`interrupt` is
        called (False); drain what arrived."""
        sock = self._socket()
        ready = self._interrupt.wait([sock.fileno()] if sock is not None else [], timeout_s)
        if ready and sock is not None:
            with contextlib.suppress(BlockingIOError):
                while sock.recv(64):
                    pass
        return bool(ready)

    def _socket(self) -> socket.socket | None:
        if self._sock is not None and self._pid == os.getpid():
            return self._sock
        self._sock = None  # a socket inherited across fork() belongs to the parent
        try:
            self._dir.mkdir(mode=0o700, exist_ok=True)
            path = self._dir / f"{os.getpid()}-{secrets.token_hex(4)}"
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            sock.bind(str(path))
            sock.setblocking(False)
        except OSError:
            return None
        self._sock, self._path, self._pid = sock, path, os.getpid()
        return sock

    def close(self) -> None:
        """Stop receiving: close and remove this process's socket."""
        if self._sock is not None and self._pid == os.getpid():
            self._sock.close()
            if self._path is not None:
                with contextlib.suppress(OSError):
                    self._path.unlink()
        self._sock = None
        self._interrupt.close()
