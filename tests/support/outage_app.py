"""The app real worker processes run in the outage tests (``--app tests.support.outage_app``).

* ``store_outage(failing)``: on its first ``failing`` attempts, its ``ctx.db_step`` meets a real
  failure of jobguard's store, then it succeeds: on SQLite the handler holds the file's write
  lock on a connection of its own while the step waits for it (the store's busy timeout runs
  out); on PostgreSQL the step's SQL has the server terminate the step's own connection (what
  an administrator's ``pg_terminate_backend`` or a server restart does).
* ``store_outage_declared(failing)``: the same, on a task that declares
  ``transient=(MailAPIError,)`` as the doctor advises for an HTTP client's errors.
* ``hostile_commit(n)``: a ``db_step`` whose one SQL text inserts a row and then tries to commit
  it on its own (``INSERT …; COMMIT; BEGIN``), then fails as a crash would before the step is
  recorded, on every attempt but the last.
* ``mail(n)``: calls the HTTP mail API at ``OUTAGE_MAIL_URL`` with ``httpx`` and
  ``raise_for_status()`` (undeclared errors: the natural client code), recording each call.

Each handler appends ``{"job", "attempt", "what"}`` lines to ``events-<pid>.jsonl`` in the
store's home directory; :func:`read_events` reads them back.
"""

from __future__ import annotations

import os
import sqlite3
from typing import Any

import httpx

from jobguard import App, Context
from jobguard.backends.sqlite import SQLiteBackend
from tests.support import jsonl_events, stores

MAIL_URL_ENV = "OUTAGE_MAIL_URL"
STORE_OUTAGE = "store_outage"
STORE_OUTAGE_DECLARED = "store_outage_declared"
MAIL = "mail"
HOSTILE_COMMIT = "hostile_commit"
HOSTILE_ROWS = "hostile_rows"
HOSTILE_ATTEMPTS = 3
BUSY_TIMEOUT_S = 0.5  # the SQLite store's busy timeout in these workers: a locked file fails fast


class MailAPIError(Exception):
    """An error the declared task names in ``transient=`` (never raised here)."""


def _record(url: str, ctx: Context, what: str) -> None:
    jsonl_events.append(url, job=ctx.job_id, attempt=ctx.attempt, what=what)


read_events = jsonl_events.read_all


def _failing_step(url: str, ctx: Context, name: str) -> None:
    """A db_step that meets a real store failure (see the module docstring)."""
    if stores.kind_of(url) == "sqlite":
        holder = sqlite3.connect(stores.sqlite_file(url), timeout=5.0, isolation_level=None)
        try:
            holder.execute("BEGIN IMMEDIATE")
            ctx.db_step(name, lambda conn: conn.execute("SELECT 1").fetchone()[0])
        finally:
            holder.close()
    else:
        kill_own_connection = "SELECT pg_terminate_backend(pg_backend_pid())"
        ctx.db_step(name, lambda conn: conn.execute(kill_own_connection))


def _store_outage(url: str, ctx: Context, failing: int) -> int:
    _record(url, ctx, "start")
    if ctx.attempt <= failing:
        _failing_step(url, ctx, f"write-{ctx.attempt}")
    value: int = ctx.db_step("write", lambda conn: conn.execute("SELECT 7").fetchone()[0])
    _record(url, ctx, "done")
    return value


def make_app(url: str) -> App:
    """The outage tasks on the store at ``url`` (SQLite with a short busy timeout)."""
    if stores.kind_of(url) == "sqlite":
        path = str(stores.sqlite_file(url))
        app = App(backend=SQLiteBackend(path, busy_timeout_s=BUSY_TIMEOUT_S))
    else:
        app = App(url)
    retries = {"max_attempts": 8, "backoff_base_s": 0.05, "backoff_cap_s": 0.2}

    @app.task(name=STORE_OUTAGE, operation_key="outage:{n}", **retries)
    def store_outage(ctx: Context, n: int, failing: int) -> int:
        return _store_outage(url, ctx, failing)

    @app.task(
        name=STORE_OUTAGE_DECLARED,
        operation_key="outage-declared:{n}",
        transient=(MailAPIError,),
        **retries,
    )
    def store_outage_declared(ctx: Context, n: int, failing: int) -> int:
        return _store_outage(url, ctx, failing)

    @app.task(name=HOSTILE_COMMIT, operation_key="hostile:{n}", max_attempts=HOSTILE_ATTEMPTS)
    def hostile_commit(ctx: Context, n: int) -> None:
        table = stores.table(url, HOSTILE_ROWS)

        def insert_and_commit(conn: Any) -> None:
            conn.execute(f"INSERT INTO {table} (n) VALUES ({int(n)}); COMMIT; BEGIN")
            if ctx.attempt < HOSTILE_ATTEMPTS:
                raise ConnectionError("lost before the step was recorded")

        ctx.db_step("insert", insert_and_commit)

    @app.task(name=MAIL, max_attempts=30, backoff_base_s=0.2, backoff_cap_s=1.0)
    def mail(ctx: Context, n: int) -> None:
        _record(url, ctx, "call")
        response = httpx.post(os.environ[MAIL_URL_ENV], json={"n": n}, timeout=5.0)
        response.raise_for_status()
        _record(url, ctx, "sent")

    return app
