"""The demo shop: products with stock, orders, a stock ledger and invoices in the job store's file.

Its effects (cut stock, create invoice) are plain functions over a connection, so the safe task
runs them inside ``ctx.db_step()`` (same transaction as the step record) and ``--unsafe`` runs
the very same functions on a connection of its own, committing at once.
"""

from __future__ import annotations

import random
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from jobguard.backends._sql import load_queries
from jobguard.demo.faults import FaultPlan

Q = load_queries("jobguard.demo", "shop.sql")

PRODUCTS = (
    ("TSHIRT-BLACK", 1900),
    ("TSHIRT-WHITE", 1900),
    ("HOODIE-GREY", 4900),
    ("MUG-LOGO", 1200),
    ("STICKER-PACK", 500),
    ("CAP-NAVY", 2200),
    ("TOTE-BAG", 1500),
    ("NOTEBOOK-A5", 900),
    ("POSTER-A2", 1400),
    ("SOCKS-PAIR", 1100),
)
INITIAL_STOCK = 5000
UNKNOWN_PRODUCT_ID = 999


class ValidationError(Exception):
    """The order's data can never be fulfilled: a poison job, fatal and never retried (G7.1)."""


class Executes(Protocol):
    """Anything with ``execute``: a ``sqlite3.Connection`` or the connection of a db_step."""

    def execute(self, sql: str, parameters: Any = ..., /) -> sqlite3.Cursor:
        """Run one statement."""
        ...


@dataclass(frozen=True, slots=True)
class Order:
    """One order as the fulfilment reads it (``sku`` is ``None`` for an unknown product)."""

    id: int
    product_id: int
    quantity: int
    email: str
    sku: str | None
    price_cents: int | None

    def validate(self) -> None:
        """Raise :class:`ValidationError` with a clear reason if no retry could fulfil it."""
        if self.quantity < 1:
            raise ValidationError(
                f"order {self.id}: quantity must be at least 1, got {self.quantity}"
            )
        if self.sku is None:
            raise ValidationError(f"order {self.id}: product {self.product_id} does not exist")
        if "@" not in self.email:
            raise ValidationError(f"order {self.id}: no valid email address ({self.email!r})")

    @property
    def amount_cents(self) -> int:
        """What the invoice charges."""
        return (self.price_cents or 0) * self.quantity


def connect(db_path: str | Path, busy_timeout_s: float = 30.0) -> sqlite3.Connection:
    """A connection to the shared file (autocommit; WAL is set up by the job store).

    It may be handed between threads; callers that share one serialise their use of it.
    """
    conn = sqlite3.connect(
        str(db_path), timeout=busy_timeout_s, isolation_level=None, check_same_thread=False
    )
    conn.row_factory = sqlite3.Row
    return conn


def create_shop(db_path: str | Path, plan: FaultPlan, *, unsafe: bool) -> None:
    """Create the shop's tables and fill them: products, and ``plan.orders`` orders.

    Poison orders get the invalid data the plan names. ``unsafe`` drops ``UNIQUE(order_id)``
    from the invoices table.
    """
    rng = random.Random(f"{plan.seed}:shop")
    now = time.time()
    conn = connect(db_path)
    try:
        conn.execute("BEGIN IMMEDIATE")
        for name in ("create_products", "create_orders", "create_stock_movements"):
            conn.execute(Q[name])
        conn.execute(Q["create_invoices_unsafe" if unsafe else "create_invoices_safe"])
        conn.execute(Q["create_demo_events"])
        conn.execute(Q["create_demo_run"])
        for index, (sku, price) in enumerate(PRODUCTS, start=1):
            conn.execute(
                Q["insert_product"],
                {"id": index, "sku": sku, "price_cents": price, "stock": INITIAL_STOCK},
            )
        for order_id in range(1, plan.orders + 1):
            product_id = rng.randint(1, len(PRODUCTS))
            quantity = rng.randint(1, 3)
            email = f"customer-{order_id}@shop.example"
            kind = plan.poison.get(order_id)
            if kind == "zero-quantity":
                quantity = 0
            elif kind == "unknown-product":
                product_id = UNKNOWN_PRODUCT_ID
            elif kind == "missing-email":
                email = ""
            conn.execute(
                Q["insert_order"],
                {
                    "id": order_id,
                    "product_id": product_id,
                    "quantity": quantity,
                    "email": email,
                    "now": now,
                },
            )
        for key, value in (("mode", "unsafe" if unsafe else "safe"), ("seed", str(plan.seed))):
            conn.execute(Q["put_run_value"], {"key": key, "value": value})
        conn.execute("COMMIT")
    finally:
        conn.close()


def load_order(conn: Executes, order_id: int) -> Order:
    """Read one order with its product; :class:`ValidationError` if the order does not exist."""
    row = conn.execute(Q["order_with_product"], {"order_id": order_id}).fetchone()
    if row is None:
        raise ValidationError(f"order {order_id} does not exist")
    return Order(
        id=row["id"],
        product_id=row["product_id"],
        quantity=row["quantity"],
        email=row["email"],
        sku=row["sku"],
        price_cents=row["price_cents"],
    )


def cut_stock(
    conn: Executes, order: Order, job_id: int, attempt: int, worker_id: str
) -> dict[str, int]:
    """Take the order's units off the shelf and write the ledger row; return what was cut."""
    cut = conn.execute(
        Q["cut_stock"], {"product_id": order.product_id, "quantity": order.quantity}
    ).rowcount
    if cut != 1:
        raise ValidationError(f"order {order.id}: not enough stock of {order.sku}")
    conn.execute(
        Q["insert_stock_movement"],
        {
            "order_id": order.id,
            "product_id": order.product_id,
            "quantity": order.quantity,
            "job_id": job_id,
            "attempt": attempt,
            "worker_id": worker_id,
            "now": time.time(),
        },
    )
    return {"product_id": order.product_id, "quantity": order.quantity}


def create_invoice(
    conn: Executes, order: Order, job_id: int, attempt: int, worker_id: str
) -> dict[str, Any]:
    """Insert the order's invoice with the next invoice number; return its id and number."""
    row = conn.execute(
        Q["insert_invoice"],
        {
            "order_id": order.id,
            "amount_cents": order.amount_cents,
            "job_id": job_id,
            "attempt": attempt,
            "worker_id": worker_id,
            "now": time.time(),
        },
    ).fetchone()
    return {"invoice_id": row["id"], "number": row["number"], "amount_cents": order.amount_cents}


def record_event(
    conn: Executes,
    kind: str,
    *,
    order_id: int | None = None,
    worker: str | None = None,
    detail: str | None = None,
) -> None:
    """Note something the supervisor did or saw (a kill, a freeze, a back-office lock)."""
    conn.execute(
        Q["insert_event"],
        {
            "kind": kind,
            "order_id": order_id,
            "worker": worker,
            "detail": detail,
            "now": time.time(),
        },
    )
