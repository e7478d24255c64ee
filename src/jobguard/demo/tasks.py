"""``FulfillOrder(order_id)`` as the article describes it: cut stock, create invoice, send email.

Two registrations of one task name, so the same jobs and the same faults run either way:

* safe: operation key ``fulfill-order:{order_id}``, resource lock ``order:{order_id}``, each effect
  a step (stock and invoice through ``ctx.db_step()``, the email through ``ctx.step()`` with
  ``ctx.idempotency_key("email")``), a lease and lock renewed by the heartbeat.
* unsafe: no operation key, no lock, no steps, effects committed straight away, the email sent
  without an idempotency key, and a lease shorter than a slow job (workers run without heartbeat).
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from typing import Any

from jobguard.app import App
from jobguard.context import Context
from jobguard.demo import shop
from jobguard.demo.faults import FaultPlan
from jobguard.demo.mailserver import send_mail
from jobguard.demo.sabotage import Sabotage
from jobguard.demo.settings import DemoSettings
from jobguard.task import Task

TASK_NAME = "demo.fulfill_order"
QUEUE = "fulfillment"
OPERATION_KEY = "fulfill-order:{order_id}"
RESOURCE_KEY = "order:{order_id}"


def subject_of(order: shop.Order, invoice_number: str | None) -> str:
    """The confirmation email's subject."""
    suffix = f", invoice {invoice_number}" if invoice_number else ""
    return f"Order #{order.id} confirmed{suffix}"


class _Connections:
    """One shop connection per handler thread (for reads, and for --unsafe's direct writes)."""

    def __init__(self, db_path: str) -> None:
        self._db_path = db_path
        self._local = threading.local()

    def get(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = shop.connect(self._db_path)
            self._local.conn = conn
        return conn


def _commit_now(conn: sqlite3.Connection, fn: Callable[..., Any], *args: Any) -> Any:
    """--unsafe: run one effect in its own transaction and commit it at once."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        value = fn(conn, *args)
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
    return value


def register(app: App, settings: DemoSettings, sabotage: Sabotage | None = None) -> Task:
    """Register FulfillOrder on ``app`` in the mode ``settings`` asks for; return the task.

    Worker processes pass their :class:`Sabotage` (wired to the app's hooks); the parent, which
    only enqueues, gets one that is never used.
    """
    if sabotage is None:
        sabotage = Sabotage(FaultPlan.build(settings.seed, settings.orders), settings.slow_job_s)
    connections = _Connections(settings.db_path)
    if settings.unsafe:
        return _register_unsafe(app, settings, sabotage, connections)
    return _register_safe(app, settings, sabotage, connections)


def _retry_options(settings: DemoSettings) -> dict[str, Any]:
    """What both modes share: the task's identity, retry policy and what counts as fatal."""
    return {
        "name": TASK_NAME,
        "queue": QUEUE,
        "max_attempts": settings.max_attempts,
        "backoff_base_s": settings.backoff_base_s,
        "backoff_cap_s": settings.backoff_cap_s,
        "poison_threshold": settings.poison_threshold,
        "fatal": (shop.ValidationError,),
    }


def _register_safe(
    app: App, settings: DemoSettings, sabotage: Sabotage, connections: _Connections
) -> Task:
    @app.task(
        **_retry_options(settings),
        operation_key=OPERATION_KEY,
        resource_key=RESOURCE_KEY,
        visibility_timeout_s=settings.visibility_timeout_s,
        lock_ttl_s=settings.lock_ttl_s,
    )
    def fulfill_order(ctx: Context, order_id: int) -> dict[str, Any]:
        """Cut stock, create the invoice, send the confirmation: each exactly once (G4)."""
        order = shop.load_order(connections.get(), order_id)
        order.validate()
        who = (ctx.job_id, ctx.attempt, ctx.worker_id)
        ctx.db_step("cut-stock", shop.cut_stock, order, *who)
        sabotage.after_effect(order_id, ctx.attempt, "cut-stock")
        sabotage.maybe_freeze(order_id, ctx.job_id)
        invoice = ctx.db_step("create-invoice", shop.create_invoice, order, *who)
        sabotage.after_effect(order_id, ctx.attempt, "create-invoice")
        sabotage.maybe_stall(order_id, ctx.attempt)  # e.g. rendering the invoice PDF
        message_id = ctx.step(
            "send-email",
            send_mail,
            settings.mail_url,
            to=order.email,
            subject=subject_of(order, invoice["number"]),
            idempotency_key=ctx.idempotency_key("email"),
            timeout_s=settings.mail_timeout_s,
        )
        ctx.set_external_ref(message_id)
        sabotage.after_effect(order_id, ctx.attempt, "send-email")
        return {"invoice": invoice["number"], "message_id": message_id}

    return fulfill_order


def _register_unsafe(
    app: App, settings: DemoSettings, sabotage: Sabotage, connections: _Connections
) -> Task:
    @app.task(**_retry_options(settings), visibility_timeout_s=settings.unsafe_visibility_timeout_s)
    def fulfill_order(ctx: Context, order_id: int) -> dict[str, Any]:
        """The article's broken handler: every run does every effect again."""
        conn = connections.get()
        order = shop.load_order(conn, order_id)
        order.validate()
        who = (ctx.job_id, ctx.attempt, ctx.worker_id)
        _commit_now(conn, shop.cut_stock, order, *who)
        sabotage.after_effect(order_id, ctx.attempt, "cut-stock")
        sabotage.maybe_freeze(order_id, ctx.job_id)
        invoice = _commit_now(conn, shop.create_invoice, order, *who)
        sabotage.after_effect(order_id, ctx.attempt, "create-invoice")
        sabotage.maybe_stall(order_id, ctx.attempt)
        message_id = send_mail(
            settings.mail_url,
            to=order.email,
            subject=subject_of(order, invoice["number"]),
            timeout_s=settings.mail_timeout_s,
        )
        sabotage.after_effect(order_id, ctx.attempt, "send-email")
        return {"invoice": invoice["number"], "message_id": message_id}

    return fulfill_order
