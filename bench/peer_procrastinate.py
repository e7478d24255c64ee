"""The procrastinate peer: one task inserting the benchmark's business row into PostgreSQL.

The database is ``JOBGUARD_BENCH_URL`` (procrastinate's tables live in its default schema).
"""

from __future__ import annotations

import os
import time

import procrastinate

from bench.pgdb import insert_effect

URL = os.environ.get("JOBGUARD_BENCH_URL", "postgresql://postgres@127.0.0.1:5432/postgres")

app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=URL))


@app.task(name="effect", queue="bench")
def effect(n: int, t: float) -> None:
    """Insert the business row."""
    insert_effect(URL, n, t, time.time())
