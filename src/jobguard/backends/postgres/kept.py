"""Connections that a worker's long-lived threads keep between their store calls.

A busy worker's threads each make many short store calls a second. Taking a connection from
the process's shared pool for every one of them costs CPU at each call, and more the more of
the process's threads contend for the pool (each wait hands the GIL to another). A thread
inside :meth:`KeptConnections.keep` takes one connection at its first call and uses it for the
next ones. It gives it back when it leaves, after a call that raised or that left a transaction
open (the pool then rolls it back or replaces it), and once it has kept it for
:data:`KEPT_FOR_S` (the pool replaces a connection past its lifetime when it comes back).

A call made while the thread's kept connection is in use (a store call from inside a step's
transaction) takes one from the pool, as every call outside :meth:`~KeptConnections.keep` does:
it never joins the transaction under way. At most the pool's size less :data:`UNKEPT`
connections are kept at once, so a thread that keeps none always finds one.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress

import psycopg
from psycopg.pq import TransactionStatus
from psycopg_pool import ConnectionPool

from jobguard.backends.postgres.pooled import PooledConnection

# A kept connection goes back to the pool this often, at the most, so that the pool's
# max_lifetime (an hour by default) still replaces it.
KEPT_FOR_S = 60.0
# Connections of the pool never kept: room for the calls of threads that keep none.
UNKEPT = 2

Pool = ConnectionPool[PooledConnection]


class _ThreadState(threading.local):
    """One thread's kept connection and how deep it is in :meth:`KeptConnections.keep`."""

    depth = 0
    busy = False
    conn: PooledConnection | None = None
    pool: Pool | None = None
    pid = 0
    taken_at = 0.0


class KeptConnections:
    """The kept connections of one store, taken from its pool of the calling process.

    Args:
        pool_of: The calling process's pool (a new one after a fork).
        pool_size: The most connections that pool opens (read at each new keeper).
    """

    def __init__(self, pool_of: Callable[[], Pool], pool_size: Callable[[], int]) -> None:
        self._pool_of = pool_of
        self._pool_size = pool_size
        self._thread = _ThreadState()
        self._guard = threading.Lock()
        self._kept = 0
        self._kept_pid = os.getpid()

    @property
    def kept(self) -> int:
        """How many connections threads of this process keep now."""
        with self._guard:
            return self._kept if self._kept_pid == os.getpid() else 0

    @contextmanager
    def keep(self) -> Iterator[None]:
        """While inside, this thread's calls of :meth:`connection` reuse one connection."""
        state = self._thread
        state.depth += 1
        try:
            yield
        finally:
            state.depth -= 1
            if state.depth == 0:
                self._give_back()

    @contextmanager
    def connection(self) -> Iterator[PooledConnection]:
        """A connection for one call: the thread's kept one when it keeps one that is not in
        use, else one of the pool's for this call alone."""
        state = self._thread
        conn = self._take() if state.depth and not state.busy else None
        if conn is None:
            with self._pool_of().connection() as pooled:
                yield pooled
            return
        state.busy = True
        try:
            yield conn
        except BaseException:
            self._give_back()
            raise
        finally:
            state.busy = False
        left_open = conn.info.transaction_status != TransactionStatus.IDLE
        if left_open or time.monotonic() - state.taken_at >= KEPT_FOR_S:
            self._give_back()

    def _take(self) -> PooledConnection | None:
        """The thread's kept connection, taken now if it has none and there is room (None:
        no room, the call takes one of the pool's)."""
        state = self._thread
        pid = os.getpid()
        if state.conn is not None and state.pid != pid:
            # Kept by the parent before a fork: its server session is the parent's.
            state.conn = state.pool = None
        if state.conn is not None:
            return state.conn
        with self._guard:
            if self._kept_pid != pid:
                self._kept, self._kept_pid = 0, pid
            if self._kept >= self._pool_size() - UNKEPT:
                return None
            self._kept += 1
        try:
            pool = self._pool_of()
            conn = pool.getconn()
        except BaseException:
            with self._guard:
                self._kept -= 1
            raise
        state.conn, state.pool, state.pid, state.taken_at = conn, pool, pid, time.monotonic()
        return conn

    def _give_back(self) -> None:
        """Return the thread's kept connection, if it has one, to the pool it came from."""
        state = self._thread
        conn, pool = state.conn, state.pool
        state.conn = state.pool = None
        if conn is None or pool is None or state.pid != os.getpid():
            return
        with self._guard:
            if self._kept_pid == state.pid:
                self._kept -= 1
        with suppress(psycopg.Error):  # the pool closes what it cannot take back
            pool.putconn(conn)
