"""The demo's fault plan: which order meets which fault, reproducible from the seed (pure).

The parent and every worker process build the same plan from ``(seed, orders)``, so a seed
replays the same crashes, stalls and poison orders whatever the scheduling. First attempts get
exact, seeded selections (so even a small run meets every fault at least once); later attempts
crash by a hash of ``(seed, order, attempt)`` at a low rate, the way real crashes strike retries
too. The mail service's faults are seeded separately, per idempotency key
(:class:`~jobguard.demo.mailserver.MailFaults`).
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass

# Where a worker may die: right after each effect has committed, before the job is acked.
CRASH_POINTS = ("cut-stock", "create-invoice", "send-email")

# Invalid order data that no retry can fix: each poison order gets one of these.
POISON_KINDS = ("zero-quantity", "unknown-product", "missing-email")

FIRST_ATTEMPT_CRASH_RATE = 0.04
RETRY_CRASH_RATE = 0.02
SLOW_RATE = 0.05
POISON_RATE = 0.02
HELD_RATE = 0.02
LATE_RATE = 0.03
ORDERS_PER_FREEZE = 100
MAX_COPIES = 3


def _count(rate: float, orders: int, minimum: int = 1) -> int:
    return max(minimum, round(rate * orders))


def _roll(seed: int, *parts: object) -> float:
    """A uniform number in [0, 1) fixed by the seed and the parts."""
    text = "\x00".join(str(part) for part in (seed, *parts))
    digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


@dataclass(frozen=True, slots=True)
class FaultPlan:
    """What happens to which order (order ids are 1..orders).

    Attributes:
        seed: The seed everything is drawn from.
        orders: Number of orders.
        copies: Order id -> how many times its webhook fires (1 to 3; duplicates are
            redeliveries and double clicks).
        poison: Order id -> the kind of invalid data it carries.
        first_crash: Order id -> the effect after which its first attempt SIGKILLs its worker.
        slow: Orders whose first attempt stalls longer than the lease and the lock TTL.
        freeze: Orders whose first attempt has its worker process frozen (SIGSTOP) after the
            stock cut, long enough for its resource lock to expire.
        held: Orders a back-office user holds locked when their fulfilment first arrives.
        late: Orders whose webhook fires once more after they were fulfilled.
    """

    seed: int
    orders: int
    copies: dict[int, int]
    poison: dict[int, str]
    first_crash: dict[int, str]
    slow: frozenset[int]
    freeze: frozenset[int]
    held: frozenset[int]
    late: frozenset[int]

    @classmethod
    def build(cls, seed: int, orders: int) -> FaultPlan:
        """Draw the plan for ``orders`` orders from ``seed`` (deterministic)."""
        if orders < 1:
            raise ValueError("orders must be >= 1")
        rng = random.Random(seed)
        ids = list(range(1, orders + 1))
        copies = {order: rng.randint(1, MAX_COPIES) for order in ids}
        shuffled = ids[:]
        rng.shuffle(shuffled)
        # Poison orders first, then disjoint groups for the faults that need a valid order.
        n_poison = min(_count(POISON_RATE, orders), max(0, orders - 1))
        poison_ids, rest = shuffled[:n_poison], shuffled[n_poison:]
        poison = {order: POISON_KINDS[i % len(POISON_KINDS)] for i, order in enumerate(poison_ids)}

        def take(count: int) -> list[int]:
            nonlocal rest
            picked, rest = rest[:count], rest[count:]
            return picked

        freeze = take(max(1, orders // ORDERS_PER_FREEZE))
        crash_ids = take(_count(FIRST_ATTEMPT_CRASH_RATE, orders, minimum=2))
        first_crash = {order: rng.choice(CRASH_POINTS) for order in crash_ids}
        slow = take(_count(SLOW_RATE, orders))
        held = take(_count(HELD_RATE, orders))
        # Late redeliveries may hit any valid order, including ones that met other faults.
        valid = [order for order in ids if order not in poison]
        late = rng.sample(valid, min(len(valid), _count(LATE_RATE, orders)))
        return cls(
            seed=seed,
            orders=orders,
            copies=copies,
            poison=poison,
            first_crash=first_crash,
            slow=frozenset(slow),
            freeze=frozenset(freeze),
            held=frozenset(held),
            late=frozenset(late),
        )

    def crash_point(self, order_id: int, attempt: int) -> str | None:
        """The effect after which this delivery kills its worker, or ``None``."""
        if attempt <= 1:
            return self.first_crash.get(order_id)
        if _roll(self.seed, "crash", order_id, attempt) < RETRY_CRASH_RATE:
            index = int(_roll(self.seed, "crash-point", order_id, attempt) * len(CRASH_POINTS))
            return CRASH_POINTS[index]
        return None

    def is_slow(self, order_id: int, attempt: int) -> bool:
        """Does this delivery stall past its lease and lock TTL?"""
        return attempt <= 1 and order_id in self.slow

    def freezes(self, order_id: int, attempt: int) -> bool:
        """Is this delivery's worker frozen after the stock cut?"""
        return attempt <= 1 and order_id in self.freeze

    def deliveries(self) -> list[tuple[float, int]]:
        """``(arrival, order_id)`` of every webhook, in arrival order.

        Order ``n`` is paid at time ``n - 1`` (in units of one order's interval); its duplicate
        deliveries follow 1 to 8 intervals later, so some land while the first is still queued
        or running (the dedup key folds them in) and some after it completed (the operation
        record turns them away).
        """
        rng = random.Random(f"{self.seed}:deliveries")
        arrivals: list[tuple[float, int]] = []
        for order in range(1, self.orders + 1):
            arrivals.append((float(order - 1), order))
            for _ in range(self.copies[order] - 1):
                arrivals.append((order - 1 + rng.uniform(1.0, 8.0), order))
        arrivals.sort()
        return arrivals

    def summary(self) -> dict[str, int]:
        """How many orders meet each planned fault."""
        return {
            "webhook_deliveries": sum(self.copies.values()),
            "duplicate_deliveries": sum(self.copies.values()) - self.orders,
            "poison_orders": len(self.poison),
            "first_attempt_crashes": len(self.first_crash),
            "slow_jobs": len(self.slow),
            "frozen_workers": len(self.freeze),
            "back_office_holds": len(self.held),
            "late_redeliveries": len(self.late),
        }
