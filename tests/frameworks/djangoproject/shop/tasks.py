"""Django tasks (``@task``) run by jobguard's workers, with jobguard's operation key (and, for
restocking, a concurrency limit: one delivery at the dock at a time)."""

import time

from django_tasks import task

from jobguard.contrib.django import DjangoSteps
from jobguard.contrib.django.tasks import current_context, guarded


def record_payment(_conn: None, order_id: int) -> int:
    from shop.models import Payment

    Payment.objects.create(order_id=order_id)
    return order_id


@task()
@guarded(operation_key="refund:{order_id}")
def refund(order_id: int) -> int:
    ctx = current_context()
    return ctx.db_step("refund", record_payment, order_id, on=DjangoSteps())


@task()
@guarded(operation_key="restock:{sku}", concurrency_key="dock", concurrency_limit=1)
def restock(sku: str) -> str:
    time.sleep(0.3)  # at the dock a while, so that a second delivery finds the slot held
    return sku
