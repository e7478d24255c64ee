"""A TCP proxy the network tests put between a worker process and the real PostgreSQL.

Modes, switched while connections are open:

* pass: bytes go through as they come;
* latency: every chunk is held ``latency_s`` before it goes on, in both directions;
* black hole: nothing goes through, and nothing is refused: what is sent is read and dropped,
  new connections are accepted and never answered (a failed switch, a NAT timeout, a paused
  VM, as the client's side of the connection sees them);
* reset: :meth:`FaultProxy.reset_all` cuts every open connection with a TCP reset,
  :meth:`FaultProxy.reset_on` cuts the connection that next sends given bytes (a statement's
  text), before they reach the server: a reset in the middle of that statement's transaction;
  and :meth:`FaultProxy.reset_reply_to` passes those bytes and cuts the connection as the
  server answers them: the statement ran (outside a transaction, it committed), and the client
  never hears so.

:meth:`FaultProxy.heal` ends a black hole; the connections that lost bytes in it are reset, as
the client's own TCP timeout would have ended them.
"""

from __future__ import annotations

import contextlib
import select
import socket
import struct
import threading
import time
from urllib.parse import urlsplit, urlunsplit

# PostgreSQL's ReadyForQuery message: type "Z", length 5 (then one status byte).
READY_FOR_QUERY = b"Z\x00\x00\x00\x05"
PASS = "pass"
LATENCY = "latency"
BLACK_HOLE = "black_hole"


class _Pair:
    """One proxied connection: the client's socket and ours to the server."""

    def __init__(self, client: socket.socket, server: socket.socket) -> None:
        self.client = client
        self.server = server
        self.closed = False
        self.dropped = False  # lost bytes in a black hole: its stream is broken for good
        self.cut_reply = False  # the server's next ReadyForQuery is not passed: a reset instead
        self.reply_tail = b""  # the last bytes the server sent, for a message split across reads

    def reset(self) -> None:
        """Close both ends with a TCP reset (SO_LINGER 0), once."""
        if self.closed:
            return
        self.closed = True
        for sock in (self.client, self.server):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.close()


class FaultProxy:
    """Listens on a free local port and forwards to ``target`` (see the module docstring)."""

    def __init__(self, target: tuple[str, int] = ("127.0.0.1", 5432)) -> None:
        self.target = target
        self.mode = PASS
        self.latency_s = 0.0
        self.resets = 0
        self.reset_marker: bytes | None = None
        self.reply_marker: bytes | None = None
        self.replies_cut = 0
        self.client_sends = 0  # chunks the clients sent: round trips, for one request at a time
        # Round trips the server finished (its ReadyForQuery), counted whatever the chunking.
        self.server_readies = 0
        self._lock = threading.Lock()
        self._pairs: list[_Pair] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._stopped = False
        threading.Thread(target=self._accept, daemon=True, name="faultproxy-accept").start()

    def url_for(self, url: str) -> str:
        """``url`` (a PostgreSQL URL of the target) through this proxy."""
        parts = urlsplit(url)
        user = f"{parts.username}@" if parts.username else ""
        return urlunsplit(parts._replace(netloc=f"{user}127.0.0.1:{self.port}"))

    def pass_through(self) -> None:
        """Forward everything from now on."""
        self.mode = PASS

    def latency(self, seconds: float) -> None:
        """Hold every chunk ``seconds`` before forwarding it, each way."""
        self.latency_s = seconds
        self.mode = LATENCY

    def black_hole(self) -> None:
        """Drop everything from now on; answer nothing."""
        self.mode = BLACK_HOLE

    def heal(self) -> None:
        """End a black hole: reset the connections that lost bytes in it, pass the rest."""
        with self._lock:
            broken = [pair for pair in self._pairs if pair.dropped]
        for pair in broken:
            self._reset(pair)
        self.mode = PASS

    def reset_all(self) -> None:
        """Cut every open connection with a TCP reset."""
        with self._lock:
            pairs = list(self._pairs)
        for pair in pairs:
            self._reset(pair)

    def reset_on(self, marker: bytes) -> None:
        """Reset the connection that next sends ``marker``, once (the bytes are not passed)."""
        self.reset_marker = marker

    def reset_reply_to(self, marker: bytes) -> None:
        """Pass the bytes ``marker`` is in, once, then reset that connection as the server
        says it is done with them (its ReadyForQuery is not passed)."""
        self.reply_marker = marker

    def close(self) -> None:
        """Stop accepting and reset every connection."""
        self._stopped = True
        self._listener.close()
        self.reset_all()

    def _reset(self, pair: _Pair) -> None:
        with self._lock:
            if pair in self._pairs:
                self._pairs.remove(pair)
                self.resets += 1
        pair.reset()

    def _accept(self) -> None:
        while not self._stopped:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.target, timeout=5.0)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            pair = _Pair(client, server)
            with self._lock:
                self._pairs.append(pair)
            for source, sink in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(pair, source, sink), daemon=True).start()

    def _pump(self, pair: _Pair, source: socket.socket, sink: socket.socket) -> None:
        try:
            while not pair.closed:
                ready, _, _ = select.select([source], [], [], 0.05)
                if not ready:
                    continue
                chunk = source.recv(65536)
                if not chunk:
                    break
                if source is pair.client:
                    self.client_sends += 1
                else:
                    seen = pair.reply_tail + chunk
                    self.server_readies += seen.count(READY_FOR_QUERY)
                    pair.reply_tail = seen[-(len(READY_FOR_QUERY) - 1) :]
                marker = self.reset_marker
                if marker is not None and source is pair.client and marker in chunk:
                    self.reset_marker = None
                    self._reset(pair)
                    return
                if source is pair.server and pair.cut_reply and READY_FOR_QUERY in chunk:
                    # The server is done with the statement (and, outside a transaction, has
                    # committed it) when it says it is ready for the next one.
                    self.replies_cut += 1
                    self._reset(pair)
                    return
                marker = self.reply_marker
                if marker is not None and source is pair.client and marker in chunk:
                    self.reply_marker = None
                    pair.cut_reply = True
                if self.mode == BLACK_HOLE:
                    pair.dropped = True
                    continue
                if self.mode == LATENCY:
                    time.sleep(self.latency_s)
                sink.sendall(chunk)
        except (OSError, ValueError):
            pass
        if not pair.dropped:
            self._reset(pair)
