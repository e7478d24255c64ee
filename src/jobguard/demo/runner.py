"""Run the demo: set up the shop, stream the webhooks, supervise the workers until done.

The parent process owns the mail service (so its log outlives every worker), fires the orders'
webhooks and keeps the worker processes alive (:mod:`jobguard.demo.supervisor`). Once every
webhook has fired, no job is queued or running and no back-office hold or freeze is pending, it
stops the workers with SIGTERM and writes the mail service's log beside the database, where the
report (:mod:`jobguard.demo.report`) reads it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from jobguard.app import App
from jobguard.demo import report, shop
from jobguard.demo.backoffice import BackOffice, EventLog
from jobguard.demo.faults import FaultPlan
from jobguard.demo.mailserver import MailServer
from jobguard.demo.report import RunInfo
from jobguard.demo.settings import MAIL_FAULTS, DemoFiles, DemoSettings
from jobguard.demo.supervisor import Supervisor
from jobguard.demo.tasks import register
from jobguard.demo.webhooks import Feeder, LateRedeliveries, Webhooks
from jobguard.models import JobStatus

TICK_S = 0.1

Progress = Callable[[dict[str, Any]], None]


@dataclass(frozen=True, slots=True)
class RunResult:
    """How the run went, for the report."""

    settings: DemoSettings
    info: RunInfo


class _Run:
    """The parts of one run, wired together (the mail service is already up)."""

    def __init__(self, settings: DemoSettings, files: DemoFiles, plan: FaultPlan) -> None:
        self.app = App(f"sqlite:///{files.db}")
        task = register(self.app, settings)  # the parent enqueues through the same definition
        shop.create_shop(files.db, plan, unsafe=settings.unsafe)
        self.events = EventLog(files.db)
        webhooks = Webhooks(task, settings.unsafe)
        self.back_office = BackOffice(self.app, files.db, self.events)
        # --unsafe takes no locks, so the back office has nothing to hold there.
        holder = None if settings.unsafe else self.back_office
        self.feeder = Feeder(plan, settings.orders_per_s, webhooks, holder)
        self.late = LateRedeliveries(str(files.db), set(plan.late), webhooks, self.events)
        self.supervisor = Supervisor(settings, files, self.events)
        self.monitor = shop.connect(files.db)

    def start(self) -> None:
        self.supervisor.start()
        self.feeder.start()

    def tick(self) -> tuple[bool, dict[JobStatus, int]]:
        """Do the periodic work; return whether the run is over, and the job counts."""
        if self.feeder.error is not None:
            raise self.feeder.error
        self.supervisor.poll()
        self.back_office.poll()
        self.late.poll()
        counts = self.app.counts()
        busy = (
            counts[JobStatus.QUEUED]
            or counts[JobStatus.RUNNING]
            or self.feeder.is_alive()
            or self.late.pending
            or self.back_office.holding
            or self.supervisor.freezer.active
        )
        return not busy, counts

    def stats(self, counts: dict[JobStatus, int]) -> dict[str, Any]:
        """Numbers for the progress display."""
        row = self.monitor.execute(report.Q["live_progress"]).fetchone()
        stats: dict[str, Any] = dict(row) if row is not None else {}
        stats.update({status.value: n for status, n in counts.items()})
        return stats

    def close(self) -> None:
        self.feeder.stop()
        self.feeder.join()
        self.supervisor.stop()
        self.back_office.close()
        self.late.close()
        self.monitor.close()
        self.events.close()
        self.app.close()


def run_demo(
    settings: DemoSettings,
    files: DemoFiles,
    *,
    timeout_s: float = 120.0,
    progress: Progress | None = None,
) -> RunResult:
    """Run the whole demo once; the database and mail log are left in ``files`` for the report.

    Args:
        settings: Sizes and timings (``db_path`` and ``mail_url`` are filled in here).
        files: Where the database, mail log, worker log and settings file go.
        timeout_s: Stop after this long; what is unfinished is then reported as lost.
        progress: Called every tick with live numbers (for the progress display).
    """
    started = time.monotonic()
    plan = FaultPlan.build(settings.seed, settings.orders)
    timed_out = False
    with MailServer(faults=MAIL_FAULTS, seed=settings.seed) as mail:
        settings = replace(settings, db_path=str(files.db), mail_url=mail.url)
        files.settings.write_text(settings.to_json(), encoding="utf-8")
        run = _Run(settings, files, plan)
        try:
            run.start()
            while True:
                done, counts = run.tick()
                if progress is not None:
                    progress({**run.stats(counts), "elapsed_s": time.monotonic() - started})
                if done:
                    break
                if time.monotonic() - started > timeout_s:
                    timed_out = True
                    break
                time.sleep(TICK_S)
        finally:
            run.close()
        files.mail_log.write_text(json.dumps(mail.log(), indent=1), encoding="utf-8")
    info = RunInfo(
        mode=settings.mode,
        seed=settings.seed,
        orders=settings.orders,
        workers=settings.workers,
        wall_time_s=time.monotonic() - started,
        timed_out=timed_out,
    )
    return RunResult(settings=settings, info=info)
