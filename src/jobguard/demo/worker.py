"""A demo worker process: ``python -m jobguard.demo.worker --settings FILE --worker-id ID``.

Started, restarted and stopped (SIGTERM) by :mod:`jobguard.demo.supervisor`. Prints ``READY``
when it is about to fetch; in ``--unsafe`` mode it runs without heartbeat, as the demo intends.
If the supervisor dies, the worker notices and stops on its own.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
import time
from pathlib import Path

from jobguard.app import App
from jobguard.demo.faults import FaultPlan
from jobguard.demo.sabotage import READY, Sabotage, SabotageHooks
from jobguard.demo.settings import DemoSettings
from jobguard.demo.tasks import QUEUE, register
from jobguard.worker import Worker

ORPHAN_CHECK_S = 0.5


def _stop_when_orphaned(worker: Worker, parent_pid: int) -> None:
    """Stop gracefully if the supervisor died (this process was handed to another parent)."""
    while os.getppid() == parent_pid:
        time.sleep(ORPHAN_CHECK_S)
    worker.stop()


def main(argv: list[str] | None = None) -> int:
    """Run one worker until SIGTERM; return the exit code."""
    parser = argparse.ArgumentParser(prog="python -m jobguard.demo.worker")
    parser.add_argument("--settings", required=True, type=Path)
    parser.add_argument("--worker-id", required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING, format=f"%(asctime)s {args.worker_id} %(name)s: %(message)s"
    )
    settings = DemoSettings.from_json(args.settings.read_text("utf-8"))
    sabotage = Sabotage(FaultPlan.build(settings.seed, settings.orders), settings.slow_job_s)
    app = App(f"sqlite:///{settings.db_path}", hooks=SabotageHooks(sabotage))
    register(app, settings, sabotage)
    worker = app.worker(
        [QUEUE],
        concurrency=settings.concurrency,
        prefetch=0,
        grace_s=5.0,
        poll_interval_s=0.05,
        worker_id=args.worker_id,
        heartbeat=not settings.unsafe,
    )
    watchdog = threading.Thread(
        target=_stop_when_orphaned, args=(worker, os.getppid()), name="demo-watchdog", daemon=True
    )
    watchdog.start()
    sys.stdout.write(f"{READY}\n")
    sys.stdout.flush()
    worker.run()
    app.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
