"""Run inside the project (DJANGO_SETTINGS_MODULE=settings): `python scenario.py enqueue|check`."""

import json
import os
import sys

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "settings")
django.setup()

from django.db import connection, transaction  # noqa: E402
from shop.jobs import app, pay  # noqa: E402
from shop.models import Order, Payment  # noqa: E402


class Abort(Exception):
    """Rolls the request's transaction back."""


_ = app.backend  # opened before a transaction holds the SQLite write lock
if sys.argv[1] == "enqueue":
    from jobguard.exceptions import ConfigurationError

    try:  # outside atomic() Django's connection is in autocommit mode: the job would be alone
        pay.enqueue(order_id=0, connection=connection)
    except ConfigurationError as exc:
        print(json.dumps({"refused": "autocommit" in str(exc)}))
    try:
        with transaction.atomic():
            order = Order.objects.create()
            pay.enqueue(order_id=order.id, connection=connection)
            raise Abort
    except Abort:
        pass
    print(json.dumps({"orders": Order.objects.count(), "jobs": len(app.jobs())}))
    with transaction.atomic():
        order = Order.objects.create()
        pay.enqueue(order_id=order.id, connection=connection)
    print(json.dumps({"orders": Order.objects.count(), "jobs": len(app.jobs())}))
elif sys.argv[1] == "tasks":
    from shop.tasks import refund

    try:
        with transaction.atomic():
            refund.enqueue(order_id=500)
            raise Abort
    except Abort:
        pass
    with transaction.atomic():
        first = refund.enqueue(order_id=501)
    second = refund.enqueue(501)  # the same operation again (a duplicate request)
    print(json.dumps({"jobs": len(app.jobs()), "ids": [first.id, second.id]}))
elif sys.argv[1] == "limits":
    from shop.tasks import restock

    from jobguard.contrib.django.tasks import guarded
    from jobguard.exceptions import ConfigurationError

    stored = [app.get_job(int(restock.enqueue(sku=sku).id)) for sku in ("a", "b")]
    refused = []
    half, zero = {"concurrency_key": "dock"}, {"concurrency_key": "dock", "concurrency_limit": 0}
    for options in (half, zero):
        try:
            guarded(operation_key="x", **options)
        except ConfigurationError as exc:
            refused.append(str(exc))
    print(
        json.dumps(
            {
                "limits": [[job.concurrency_key, job.concurrency_limit] for job in stored],
                "refused": refused,
            }
        )
    )
elif sys.argv[1] == "limit-results":
    jobs = [job for job in app.jobs() if '"shop.tasks.restock"' in job.payload]
    waits = [
        a.error_message
        for job in jobs
        for a in app.attempts(job_id=job.id)
        if a.outcome.value == "deferred"
    ]
    print(json.dumps({"status": sorted(job.status.value for job in jobs), "waits": waits}))
elif sys.argv[1] == "task-results":
    from shop.tasks import refund

    results = [refund.get_result(result_id) for result_id in sys.argv[2:]]
    print(
        json.dumps(
            {
                "status": [str(r.status) for r in results],
                "payments": sorted(p.order_id for p in Payment.objects.all()),
            }
        )
    )
else:
    [job] = app.jobs()
    print(
        json.dumps(
            {
                "status": job.status.value,
                "payments": Payment.objects.count(),
                "paid": [o.paid for o in Order.objects.all()],
            }
        )
    )
