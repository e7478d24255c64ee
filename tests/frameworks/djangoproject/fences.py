"""`python fences.py`: db_step on Django's connection against the store's guard, on a controlled
clock. Prints what each case left: ORM rows, whether the step function ran, what was raised."""

import json
import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "settings")
django.setup()

from django.db import connection  # noqa: E402
from shop.models import Payment  # noqa: E402
from tests.support.ports import begin_operation, fetch, guard_of  # noqa: E402

from jobguard.backends.postgres import PostgresBackend  # noqa: E402
from jobguard.backends.sqlite import SQLiteBackend  # noqa: E402
from jobguard.contrib.django import DjangoSteps, store_url  # noqa: E402
from jobguard.models import Guard, JobSpec  # noqa: E402
from jobguard.testing import ControlledClock  # noqa: E402

clock = ControlledClock()
url = store_url()
backend = (
    SQLiteBackend(url.removeprefix("sqlite:///"), clock=clock)
    if url.startswith("sqlite")
    else PostgresBackend(url, clock=clock)
)
steps = DjangoSteps()
report = {}


def delivered(key, resource):
    backend.enqueue(
        JobSpec(
            task="pay",
            queue="default",
            payload="{}",
            max_attempts=3,
            visibility_timeout_s=60.0,
            operation_key=key,
        )
    )
    (delivery,) = fetch(backend, ["default"], 1, "w1")
    guard = guard_of(delivery)
    grant = backend.acquire_lock(resource, f"owner-{key}", 5.0)
    guard = Guard(guard.job_id, guard.lease_token, guard.attempt_id, grant)
    assert begin_operation(backend, guard, key, resource) is not None
    return guard


def outcome(case, guard, key, fn):
    ran = []
    before = Payment.objects.count()

    def counted(_conn, order_id):
        ran.append(order_id)
        return fn(order_id)

    try:
        backend.db_step(guard, key, "pay", counted, (1,), steps)
        raised = None
    except Exception as exc:
        raised = type(exc).__name__
    report[case] = {"ran": len(ran), "rows": Payment.objects.count() - before, "raised": raised}


def pay(order_id):
    Payment.objects.create(order_id=order_id)
    return order_id


# 1. The step commits its ORM write with its record; a retry does not run it again.
guard = delivered("pay:1", "order:1")
outcome("commit", guard, "pay:1", pay)
outcome("again", guard, "pay:1", pay)


# 1b. ORM calls that open their own savepoint (get_or_create) inside the step.
def pay_once(order_id):
    Payment.objects.get_or_create(order_id=100 + order_id)
    return order_id


outcome("savepoint", delivered("pay:5", "order:5"), "pay:5", pay_once)


# 2. The step function raises after its ORM write: nothing commits.
def pay_then_fail(order_id):
    pay(order_id)
    raise ValueError("card declined")


outcome("raises", delivered("pay:2", "order:2"), "pay:2", pay_then_fail)

# 3. The fence is stale before the step: refused, the function never runs.
guard = delivered("pay:3", "order:3")
clock.advance(6)
backend.acquire_lock("order:3", "newer", 30.0)
outcome("stale", guard, "pay:3", pay)

# 4. PostgreSQL: the lock is taken over while the ORM write is pending (SQLite's step holds the
# file's write lock, so no takeover can commit meanwhile).
if connection.vendor == "postgresql":
    guard = delivered("pay:4", "order:4")

    def pay_while_taken_over(order_id):
        pay(order_id)
        clock.advance(6)
        assert backend.acquire_lock("order:4", "newer", 30.0) is not None
        return order_id

    outcome("taken-over", guard, "pay:4", pay_while_taken_over)

backend.close()
print(json.dumps(report))
