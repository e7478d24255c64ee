"""The shop's tables."""

from django.db import models


class Order(models.Model):
    """An order; ``paid`` is set once by the pay job."""

    paid = models.IntegerField(default=0)

    class Meta:
        app_label = "shop"


class Payment(models.Model):
    """One row per payment made: the effect that must happen once."""

    order_id = models.IntegerField()

    class Meta:
        app_label = "shop"
