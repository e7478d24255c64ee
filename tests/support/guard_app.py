"""The app real worker processes run in the guard fault tests (``--app tests.support.guard_app``).

Two tasks:

* ``fulfill(order_id, sku, writes=False)`` — the article's order fulfillment: cut stock and
  create an invoice (``UNIQUE(order_id)``) through ``ctx.db_step()`` (the stock cut through
  ``ctx.db_writes()`` when ``writes``), then send a confirmation email to a real local HTTP mail
  service with ``ctx.idempotency_key("email")`` inside a memoised ``ctx.step()``.
* ``hold(job_no, resource, hold_s)`` — one guarded write on a shared resource, then a nap; its
  start/end events give the intervals the mutual-exclusion tests compare.

The business tables live beside the jobs (:func:`create_business_tables`): in the store's own
SQLite file, or in the store's own schema on PostgreSQL.

Fault points (names in :data:`FULFILL_POINTS` and :data:`HOLD_POINTS`) are driven by a
:class:`Faults` value, given to :func:`make_app` in-process or as JSON in the ``GUARD_FAULTS``
environment variable of a worker process (see :func:`worker_env`):

* ``crash_points``: SIGKILL the worker process there, on the ``attempts`` listed (default any),
  with probability ``rate`` decided by a hash of (seed, order or job number, attempt, point) —
  the same seed crashes the same deliveries whatever the timing.
* ``raise_points``: raise :class:`InjectedFault` (transient) there, on the same terms.
* ``pause_point``: the first delivery to reach it writes ``paused-<pid>.json`` into the events
  directory and then waits until ``resume`` exists there, so a test can SIGSTOP it at a known
  point. A process pauses once only.
* ``fatal_orders``: ``fulfill`` of these orders raises :class:`~jobguard.Fatal` on entry.

Every handler appends what it did to ``events-<pid>.jsonl`` in the store's home directory
(:func:`tests.support.stores.home_of`; one ``os.write`` per line, so a SIGKILL right after loses
nothing); :func:`read_events` reads them back.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from jobguard import App, Context, Fatal
from jobguard.demo.mailserver import send_mail
from tests.support import stores

FAULTS_ENV = "GUARD_FAULTS"
MAIL_URL_ENV = "GUARD_MAIL_URL"
LEASE_ENV = "GUARD_LEASE_S"
LOCK_TTL_ENV = "GUARD_LOCK_TTL_S"

FULFILL = "fulfill"
HOLD = "hold"

FULFILL_POINTS = (
    "start",
    "stock-cut",  # inside the cut-stock transaction, after the UPDATE
    "after-cut-stock",
    "invoice-inserted",  # inside the invoice transaction, after the INSERT
    "after-invoice",
    "email-sent",  # the mail service answered; the step is not recorded yet
    "after-email",  # every step done; the job is not finished yet
)
HOLD_POINTS = ("start", "written")

FULFILL_STEPS = ("cut-stock", "invoice", "email")

BUSINESS_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS {products} (sku TEXT PRIMARY KEY, stock INTEGER NOT NULL)",
    # No unique key here on purpose: a double stock cut shows up as two rows for one order.
    "CREATE TABLE IF NOT EXISTS {stock_moves} ("
    " id INTEGER PRIMARY KEY AUTOINCREMENT, order_id INTEGER NOT NULL, sku TEXT NOT NULL,"
    " fence INTEGER, worker_id TEXT NOT NULL)",
    # One invoice per order is a storage rule (G4.5), not a hope.
    "CREATE TABLE IF NOT EXISTS {invoices} ("
    " id INTEGER PRIMARY KEY AUTOINCREMENT, order_id INTEGER NOT NULL UNIQUE,"
    " fence INTEGER, worker_id TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS {resource_writes} ("
    " id INTEGER PRIMARY KEY AUTOINCREMENT, job_no INTEGER NOT NULL, resource TEXT NOT NULL,"
    " fence INTEGER, worker_id TEXT NOT NULL)",
)
TABLES = ("products", "stock_moves", "invoices", "resource_writes")


def business_sql(url: str, text: str) -> str:
    """Test SQL with ``{table}`` names placed beside the store, in the store's dialect."""
    names = {name: stores.table(url, name) for name in TABLES}
    return stores.dialect_sql(url, text.format(**names))


class InjectedFault(Exception):
    """A transient error raised at a ``raise_points`` fault point."""


class OutOfStockError(Exception):
    """The product has no stock left (a test set-up error, never expected)."""


@dataclass(frozen=True)
class Faults:
    """Which faults a process injects; see the module docstring."""

    crash_points: tuple[str, ...] = ()
    raise_points: tuple[str, ...] = ()
    rate: float = 1.0
    attempts: tuple[int, ...] = ()  # empty: any attempt
    pause_point: str | None = None
    fatal_orders: tuple[int, ...] = ()
    seed: int = 0

    def to_json(self) -> str:
        """The value of ``GUARD_FAULTS`` for a worker process."""
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Faults:
        """Parse ``GUARD_FAULTS``."""
        raw = json.loads(text)
        for name in ("crash_points", "raise_points", "attempts", "fatal_orders"):
            raw[name] = tuple(raw.get(name, ()))
        return cls(**raw)

    def hits(self, points: tuple[str, ...], point: str, subject: int, attempt: int) -> bool:
        """Whether delivery ``attempt`` of ``subject`` (order or job number) faults at ``point``."""
        if point not in points or (self.attempts and attempt not in self.attempts):
            return False
        if self.rate >= 1.0:
            return True
        text = f"{self.seed}\x00{subject}\x00{attempt}\x00{point}"
        digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big") / 2**64 < self.rate


def worker_env(
    *,
    faults: Faults | None = None,
    mail_url: str | None = None,
    lease_s: float | None = None,
    lock_ttl_s: float | None = None,
) -> dict[str, str]:
    """Environment variables that configure a worker process running this app.

    The lease and lock TTL are the worker's own task definition, which is what a delivery gets.
    """
    env: dict[str, str] = {}
    if lease_s is not None:
        env[LEASE_ENV] = repr(lease_s)
    if lock_ttl_s is not None:
        env[LOCK_TTL_ENV] = repr(lock_ttl_s)
    if faults is not None:
        env[FAULTS_ENV] = faults.to_json()
    if mail_url is not None:
        env[MAIL_URL_ENV] = mail_url
    return env


def events_dir(url: str) -> Path:
    """Where handlers of the store at ``url`` log events and pause markers."""
    return stores.home_of(url)


# -- business tables ------------------------------------------------------------------------------


def create_business_tables(url: str, products: dict[str, int] | None = None) -> None:
    """Create the business tables beside the store and stock the given products."""
    statements = [business_sql(url, statement) for statement in BUSINESS_SCHEMA]
    stores.execute(url, statements)
    if products:
        insert = business_sql(url, "INSERT INTO {products} (sku, stock) VALUES (?, ?)")
        stores.execute(url, [insert], sorted(products.items()))


def query(url: str, sql: str, parameters: Iterable[Any] = ()) -> list[tuple[Any, ...]]:
    """Read business rows (``{table}`` names as in :data:`BUSINESS_SCHEMA`; committed state)."""
    return stores.query(url, business_sql(url, sql), parameters)


# -- events ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Event:
    """One thing a handler did: ``kind`` plus the delivery it belonged to."""

    kind: str
    job_id: int
    attempt: int
    pid: int
    worker_id: str
    fence: int | None
    mono: float  # time.monotonic(): one system-wide clock on Linux, comparable across processes
    extra: dict[str, Any] = field(default_factory=dict)


def read_events(url: str) -> list[Event]:
    """Every event of every process, ordered by the time it was recorded."""
    found: list[Event] = []
    directory = events_dir(url)
    if not directory.exists():
        return found
    for path in sorted(directory.glob("events-*.jsonl")):
        for line in path.read_text().splitlines():
            if line:
                raw = json.loads(line)
                found.append(Event(**raw))
    return sorted(found, key=lambda event: event.mono)


class Recorder:
    """Appends events of this process to its own JSONL file."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def __call__(self, kind: str, ctx: Context, **extra: Any) -> None:
        """Append one event; it is in the kernel's hands once this returns."""
        self.directory.mkdir(parents=True, exist_ok=True)
        event = Event(
            kind=kind,
            job_id=ctx.job_id,
            attempt=ctx.attempt,
            pid=os.getpid(),
            worker_id=ctx.worker_id,
            fence=ctx.fence,
            mono=time.monotonic(),
            extra=extra,
        )
        line = (json.dumps(asdict(event)) + "\n").encode()
        path = self.directory / f"events-{os.getpid()}.jsonl"
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)


class FaultInjector:
    """Carries out a :class:`Faults` plan at the named points of a handler."""

    def __init__(self, faults: Faults, directory: Path, record: Recorder) -> None:
        self.faults = faults
        self.directory = directory
        self.record = record
        self.paused_once = False

    def __call__(self, ctx: Context, point: str, subject: int) -> None:
        """Crash, raise or pause here if the plan says so."""
        faults = self.faults
        if faults.hits(faults.crash_points, point, subject, ctx.attempt):
            self.record("crash", ctx, point=point)
            os.kill(os.getpid(), signal.SIGKILL)
        if faults.hits(faults.raise_points, point, subject, ctx.attempt):
            self.record("raise", ctx, point=point)
            raise InjectedFault(f"injected at {point} (attempt {ctx.attempt})")
        if faults.pause_point == point and not self.paused_once:
            self.paused_once = True
            self.pause(ctx, point)

    def pause(self, ctx: Context, point: str) -> None:
        """Announce the pause, then wait for the test's ``resume`` file."""
        self.directory.mkdir(parents=True, exist_ok=True)
        marker = {
            "job_id": ctx.job_id,
            "attempt": ctx.attempt,
            "fence": ctx.fence,
            "lock_owner": ctx.lock_owner,
            "point": point,
        }
        tmp = self.directory / f".paused-{os.getpid()}.tmp"
        tmp.write_text(json.dumps(marker))
        tmp.rename(self.directory / f"paused-{os.getpid()}.json")  # appears whole or not at all
        resume = self.directory / "resume"
        while not resume.exists():
            time.sleep(0.01)
        self.record("resumed", ctx, point=point, lease_lost=ctx.lease_lost)


# -- the app --------------------------------------------------------------------------------------


def customer_of(order_id: int) -> str:
    """The email address an order's confirmation goes to."""
    return f"customer-{order_id}@example.test"


def make_app(
    url: str,
    *,
    lease_s: float | None = None,
    lock_ttl_s: float | None = None,
    faults: Faults | None = None,
    mail_url: str | None = None,
) -> App:
    """The fulfillment app on the store at ``url``.

    Args:
        url: The store; the business tables live beside it (:func:`create_business_tables`).
        lease_s: The tasks' visibility timeout; default ``GUARD_LEASE_S``, else 1 s.
        lock_ttl_s: The tasks' resource lock TTL; default ``GUARD_LOCK_TTL_S``, else 1 s.
        faults: Faults to inject; default from ``GUARD_FAULTS`` (none if unset).
        mail_url: Base URL of the mail service; default from ``GUARD_MAIL_URL``.
    """
    if faults is None:
        raw = os.environ.get(FAULTS_ENV)
        faults = Faults.from_json(raw) if raw else Faults()
    mail = mail_url or os.environ.get(MAIL_URL_ENV, "")
    lease_s = lease_s or float(os.environ.get(LEASE_ENV, "1.0"))
    lock_ttl_s = lock_ttl_s or float(os.environ.get(LOCK_TTL_ENV, "1.0"))
    directory = events_dir(url)
    record = Recorder(directory)
    fault = FaultInjector(faults, directory, record)
    app = App(url)

    def sql(text: str) -> str:
        return business_sql(url, text)

    guarded = {
        "visibility_timeout_s": lease_s,
        "lock_ttl_s": lock_ttl_s,
        # Crashes are charged at delivery; the chaos run must never exhaust a job.
        "max_attempts": 100,
        "backoff_base_s": 0.05,
        "backoff_cap_s": 0.5,
        # Injected transient faults repeat by design; they are not poison.
        "poison_threshold": 100,
        "fatal": (OutOfStockError,),
    }

    def cut_stock(conn: Any, ctx: Context, order_id: int, sku: str) -> int:
        record("ran:cut-stock", ctx)
        changed = conn.execute(cut_stock_sql, (sku,)).rowcount
        if changed != 1:
            raise OutOfStockError(sku)
        conn.execute(stock_move_sql, (order_id, sku, ctx.fence, ctx.worker_id))
        fault(ctx, "stock-cut", order_id)
        found = conn.execute(sql("SELECT stock FROM {products} WHERE sku = ?"), (sku,)).fetchone()
        return int(found[0])

    cut_stock_sql = sql("UPDATE {products} SET stock = stock - 1 WHERE sku = ? AND stock > 0")
    stock_move_sql = sql(
        "INSERT INTO {stock_moves} (order_id, sku, fence, worker_id) VALUES (?, ?, ?, ?)"
    )

    # fulfill's stock cut: a db_step, or (writes) the same rows through ctx.db_writes
    cut_stock_step = {
        False: lambda ctx, order_id, sku: ctx.db_step("cut-stock", cut_stock, ctx, order_id, sku),
        True: lambda ctx, order_id, sku: ctx.db_writes(
            "cut-stock",
            [(cut_stock_sql, (sku,)), (stock_move_sql, (order_id, sku, ctx.fence, ctx.worker_id))],
        ),
    }

    def create_invoice(conn: Any, ctx: Context, order_id: int) -> dict[str, Any]:
        record("ran:invoice", ctx)
        # A plain INSERT: if this step ever ran twice, UNIQUE(order_id) would fail the job.
        invoice_id = conn.execute(
            sql(
                "INSERT INTO {invoices} (order_id, fence, worker_id) VALUES (?, ?, ?) RETURNING id"
            ),
            (order_id, ctx.fence, ctx.worker_id),
        ).fetchone()[0]
        fault(ctx, "invoice-inserted", order_id)
        return {"invoice_id": invoice_id, "fence": ctx.fence}

    def send_confirmation(ctx: Context, order_id: int, invoice_id: int) -> str:
        record("ran:email", ctx)
        message_id = send_mail(
            mail,
            to=customer_of(order_id),
            subject=f"Order {order_id} confirmed (invoice {invoice_id})",
            idempotency_key=ctx.idempotency_key("email"),
            timeout_s=5.0,
        )
        fault(ctx, "email-sent", order_id)
        return message_id

    @app.task(
        name=FULFILL,
        operation_key="fulfill-order:{order_id}",
        resource_key="order:{order_id}",
        **guarded,
    )
    def fulfill(ctx: Context, order_id: int, sku: str, writes: bool = False) -> dict[str, Any]:
        """Cut stock, create the invoice, email the customer — each exactly once."""
        record("start", ctx, order_id=order_id)
        if order_id in faults.fatal_orders:
            raise Fatal(f"order {order_id} is configured to fail")
        fault(ctx, "start", order_id)
        cut_stock_step[writes](ctx, order_id, sku)
        fault(ctx, "after-cut-stock", order_id)
        invoice = ctx.db_step("invoice", create_invoice, ctx, order_id)
        fault(ctx, "after-invoice", order_id)
        message_id = ctx.step("email", send_confirmation, ctx, order_id, invoice["invoice_id"])
        fault(ctx, "after-email", order_id)
        ctx.set_external_ref(message_id)
        record("end", ctx, order_id=order_id, lease_lost=ctx.lease_lost)
        return {"invoice_id": invoice["invoice_id"], "message_id": message_id}

    write_resource_sql = sql(
        "INSERT INTO {resource_writes} (job_no, resource, fence, worker_id) VALUES (?, ?, ?, ?)"
    )

    def write_resource(conn: Any, ctx: Context, job_no: int, resource: str) -> int | None:
        conn.execute(write_resource_sql, (job_no, resource, ctx.fence, ctx.worker_id))
        return ctx.fence

    @app.task(
        name=HOLD,
        operation_key="hold:{job_no}",
        resource_key="res:{resource}",
        **guarded,
    )
    def hold(
        ctx: Context, job_no: int, resource: str, hold_s: float = 0.0, writes: bool = False
    ) -> None:
        """Write once to the resource under its lock (through ``ctx.db_writes`` if ``writes``),
        then hold the lock ``hold_s`` seconds."""
        record("start", ctx, job_no=job_no, resource=resource)
        fault(ctx, "start", job_no)
        if writes:
            row = (job_no, resource, ctx.fence, ctx.worker_id)
            ctx.db_writes("write", [(write_resource_sql, row)])
        else:
            ctx.db_step("write", write_resource, ctx, job_no, resource)
        fault(ctx, "written", job_no)
        time.sleep(hold_s)
        record("end", ctx, job_no=job_no, resource=resource, lease_lost=ctx.lease_lost)

    return app
