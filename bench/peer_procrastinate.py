"""The procrastinate peer: one task inserting the benchmark's business row into PostgreSQL.

The database is ``JOBGUARD_BENCH_URL`` (procrastinate's tables live in its default schema).
"""

from __future__ import annotations

import os
import threading
import time

import procrastinate
import psycopg

from bench.pgdb import INSERT_EFFECT_PG

URL = os.environ.get("JOBGUARD_BENCH_URL", "postgresql://postgres@127.0.0.1:5432/postgres")

app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=URL))
_local = threading.local()


def _connection() -> psycopg.Connection[tuple[object, ...]]:
    # One autocommit connection per handler thread: each row commits on its own, as a plain
    # handler without jobguard would write it.
    conn = getattr(_local, "conn", None)
    if conn is None:
        conn = _local.conn = psycopg.connect(URL, autocommit=True)
    return conn


@app.task(name="effect", queue="bench")
def effect(n: int, t: float) -> None:
    """Insert the business row."""
    started = time.time()
    _connection().execute(INSERT_EFFECT_PG, (n, t, started, time.time()))
