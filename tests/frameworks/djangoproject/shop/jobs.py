"""The shop's jobs: the store is the project's database."""

from django.db.models import F

from jobguard import App, Context
from jobguard.contrib.django import DjangoSteps, store_url

app = App(store_url())


def record_payment(_conn: None, order_id: int) -> int:
    from shop.models import Order, Payment

    Payment.objects.create(order_id=order_id)
    Order.objects.filter(id=order_id).update(paid=F("paid") + 1)
    return order_id


@app.task(name="pay", operation_key="pay:{order_id}")
def pay(ctx: Context, order_id: int) -> int:
    return ctx.db_step("pay", record_payment, order_id, on=DjangoSteps())
