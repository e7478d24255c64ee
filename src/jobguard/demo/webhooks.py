"""The shop's producer side: the payment webhook, fired as a stream, and fired again late.

Every order's webhook fires 1-3 times (redeliveries, double clicks); the safe shop enqueues with
the webhook event's identity as dedup key (G6). Some orders' webhooks fire once more after the
order was fulfilled, past the dedup window, where only the operation record can turn them away.
"""

from __future__ import annotations

import json
import threading
import time

from jobguard.demo import shop
from jobguard.demo.backoffice import BackOffice, EventLog
from jobguard.demo.faults import FaultPlan
from jobguard.task import Task


class Webhooks:
    """The shop's payment webhook: enqueues fulfilment, with a dedup key unless ``--unsafe``."""

    def __init__(self, task: Task, unsafe: bool) -> None:
        self._task = task
        self._unsafe = unsafe

    def fire(self, order_id: int) -> None:
        """One webhook delivery for ``order_id``."""
        if self._unsafe:
            self._task.enqueue(order_id=order_id)
        else:
            # The webhook event's identity: a redelivery of the same event is folded in (G6).
            self._task.options(dedup_key=f"order-paid:{order_id}").enqueue(order_id=order_id)


class Feeder(threading.Thread):
    """Fires the webhooks as a stream at ``orders_per_s``; back-office holds go first."""

    def __init__(
        self,
        plan: FaultPlan,
        orders_per_s: float,
        webhooks: Webhooks,
        back_office: BackOffice | None,
    ) -> None:
        super().__init__(name="demo-webhooks", daemon=True)
        self._schedule = plan.deliveries()
        self._interval_s = 1.0 / orders_per_s
        self._webhooks = webhooks
        self._back_office = back_office
        self._held = set(plan.held)
        self._halt = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        """Fire every webhook at its time."""
        started = time.monotonic()
        try:
            for at, order_id in self._schedule:
                delay = started + at * self._interval_s - time.monotonic()
                if delay > 0 and self._halt.wait(delay):
                    return
                if self._back_office is not None and order_id in self._held:
                    self._held.discard(order_id)
                    self._back_office.hold(order_id)  # the agent has the order open already
                self._webhooks.fire(order_id)
        except BaseException as exc:  # surfaced by the supervisor's loop
            self.error = exc

    def stop(self) -> None:
        """Stop firing (used when the run times out)."""
        self._halt.set()


class LateRedeliveries:
    """Fire the webhook once more for some orders after they were fulfilled."""

    def __init__(
        self, db_path: str, pending: set[int], webhooks: Webhooks, events: EventLog
    ) -> None:
        self._conn = shop.connect(db_path)
        self.pending = set(pending)
        self._webhooks = webhooks
        self._events = events

    def poll(self) -> None:
        """Redeliver for every pending order whose job completed; drop the ones that died."""
        if not self.pending:
            return
        rows = self._conn.execute(
            shop.Q["order_job_states"], {"order_ids": json.dumps(sorted(self.pending))}
        ).fetchall()
        for row in rows:
            order_id = row["order_id"]
            if row["completed"]:
                self._webhooks.fire(order_id)
                self._events.record("late_redelivery", order_id=order_id)
                self.pending.discard(order_id)
            elif row["dead"] and not row["live"]:
                self.pending.discard(order_id)

    def close(self) -> None:
        """Close the connection."""
        self._conn.close()
