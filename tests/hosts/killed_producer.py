"""A producer that dies between storing its send's reservation and handing the message to the
host: ``python -m tests.hosts.killed_producer HOST ORDER``.

It sends the deduplicated ``fragile`` task of ``ORDER`` through the host's tasks module, with
the host's own send (Celery's ``Task.apply_async``, RQ's ``Queue.enqueue``, Dramatiq's
``Broker.enqueue``) replaced by a SIGKILL of this process: the fault point right after the
guard's reservation is committed and right before the broker hears of the message.
"""

from __future__ import annotations

import importlib
import os
import signal
import sys
from typing import Any, NoReturn

MODULES = {
    "celery": "tests.hosts.celery_orders",
    "rq": "tests.hosts.rq_orders",
    "dramatiq": "tests.hosts.dramatiq_orders",
}


def die(*_: Any, **__: Any) -> NoReturn:
    """The host's send, replaced: the process is killed before the broker is written to."""
    os.kill(os.getpid(), signal.SIGKILL)
    raise AssertionError("unreachable")


def main() -> None:
    host, order = sys.argv[1], int(sys.argv[2])
    module = importlib.import_module(MODULES[host])
    if host == "celery":
        from celery.app.task import Task

        Task.apply_async = die  # type: ignore[method-assign]
        module.fragile.delay(order)
    elif host == "rq":
        from rq import Queue

        Queue.enqueue = die  # type: ignore[method-assign]
        module.fragile.enqueue(module.queue, order)
    else:
        type(module.broker).enqueue = die
        module.fragile.send(order)
    raise SystemExit("the send returned: the fault point was not reached")


if __name__ == "__main__":
    main()
