"""Django: the store is the project's database; enqueue and ``db_step`` on Django's connection.

Add ``"jobguard.contrib.django"`` to ``INSTALLED_APPS``. The store is ``DATABASES["default"]``
(PostgreSQL or SQLite) unless ``JOBGUARD = {"URL": "..."}`` says otherwise; ``JOBGUARD["APP"]``
names your :class:`~jobguard.App` (``"shop.jobs:app"``) for ``manage.py jobguard worker`` and the
other commands of the CLI, which take the CLI's options. In a view::

    with transaction.atomic():
        order = Order.objects.create(...)
        fulfill.enqueue(order_id=order.id, connection=django.db.connection)

and in a handler, ``ctx.db_step("pay", mark_paid, order_id, on=DjangoSteps())`` runs
``mark_paid(None, order_id)`` inside ``transaction.atomic()`` on Django's connection, with the
step record written in the same transaction.
"""

from __future__ import annotations

from jobguard.contrib.django.store import DjangoSteps, store_url

__all__ = ["DjangoSteps", "store_url"]
