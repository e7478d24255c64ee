"""The app of the process-worker tests: ``--app tests.support.procs_app:app``, on the store
named by the ``PROCS_URL`` environment variable.

``charge(order, hang_attempts=0, hold=False)`` (and ``charge_limited``, the same handler with
a soft and a hard time limit: only a process-mode worker takes this app) runs under the lock
of the one resource ``account`` (so its jobs run one after another), and records one charge
row per run through ``ctx.db_step`` (exactly once per order, whatever happens to the
processes: the effect the tests count). Then:

* on its first ``hang_attempts`` deliveries it blocks forever on a socket that never answers,
  as a handler calling a service without a timeout does;
* with ``hold``, it waits until the test creates ``go-<order>`` in the events directory (a
  known point at which to kill or stop its process).

Every run appends ``start``, ``charged`` and ``done`` events (:mod:`tests.support.jsonl_events`)
with its job, attempt, process id and fence.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any

from jobguard import App, Context
from tests.support import jsonl_events, stores

URL_ENV = "PROCS_URL"
CHARGE = "charge"
LIMITED = "charge_limited"  # the same handler, with a soft and a hard time limit of its own
SOFT_LIMIT_S = 0.5
HARD_LIMIT_S = 30.0
LEASE_S = 1.0
LOCK_TTL_S = 1.0
MAX_ATTEMPTS = 3
CHARGES_DDL = (
    "CREATE TABLE IF NOT EXISTS {charges} ("
    " id INTEGER PRIMARY KEY AUTOINCREMENT, order_no INTEGER NOT NULL, fence INTEGER)"
)


def charges_table(url: str) -> str:
    """The charges table beside the store."""
    return stores.table(url, "charges")


def create_charges(url: str) -> None:
    """Create the table the handler's db_step writes to."""
    stores.execute(url, [stores.dialect_sql(url, CHARGES_DDL.format(charges=charges_table(url)))])


def charges(url: str) -> dict[int, int]:
    """How many charge rows each order has."""
    rows = stores.query(
        url, f"SELECT order_no, count(*) FROM {charges_table(url)} GROUP BY order_no"
    )
    return {int(order): int(count) for order, count in rows}


def let_go(url: str, order: int) -> None:
    """Let a ``hold`` run of ``order`` finish."""
    home = stores.home_of(url)
    home.mkdir(parents=True, exist_ok=True)
    (home / f"go-{order}").touch()


def events(url: str, what: str | None = None) -> list[dict[str, Any]]:
    """The handlers' events (of one kind, if given), in time order."""
    return [e for e in jsonl_events.read_all(url) if what is None or e["what"] == what]


def _block_forever() -> None:
    """Wait for an answer that never comes: a socket read without a timeout."""
    ours, _theirs = socket.socketpair()
    ours.recv(1)


def make_app(url: str) -> App:
    """The charge task on the store at ``url``."""
    app = App(url)
    table = charges_table(url)
    insert = stores.dialect_sql(url, f"INSERT INTO {table} (order_no, fence) VALUES (?, ?)")

    def charge(ctx: Context, order: int, hang_attempts: int = 0, hold: bool = False) -> None:
        def record(what: str) -> None:
            jsonl_events.append(
                url,
                what=what,
                order=order,
                job=ctx.job_id,
                attempt=ctx.attempt,
                pid=os.getpid(),
                fence=ctx.fence,
            )

        record("start")

        def write(conn: Any) -> None:
            conn.execute(insert, (order, ctx.fence))

        ctx.db_step("charge", write)
        record("charged")
        if ctx.attempt <= hang_attempts:
            _block_forever()
        go = stores.home_of(url) / f"go-{order}"
        while hold and not go.exists():
            time.sleep(0.01)
        record("done")

    guarded: dict[str, Any] = {
        "resource_key": "account",
        "operation_key": "charge:{order}",
        "visibility_timeout_s": LEASE_S,
        "lock_ttl_s": LOCK_TTL_S,
        "max_attempts": MAX_ATTEMPTS,
    }
    app.task(name=CHARGE, **guarded)(charge)
    app.task(name=LIMITED, soft_time_limit_s=SOFT_LIMIT_S, time_limit_s=HARD_LIMIT_S, **guarded)(
        charge
    )
    return app


if os.environ.get(URL_ENV):
    app = make_app(os.environ[URL_ENV])
