"""Known label sets start at zero (Prometheus practice): a worker that has not run a job yet, and
the exporter over empty queues, already serve every series a dashboard or an absence alert
reads. Checked by scraping the real endpoints of real ``jobguard worker`` and ``jobguard
exporter`` processes."""

from __future__ import annotations

import inspect
import re

from jobguard import Outcome, heartbeat, pipeline, scheduler, settler, worker
from jobguard.observability.metrics import STORE_ERROR_PLACES
from tests.observability.conftest import APP, Served, start_cli
from tests.observability.test_metrics import scrape
from tests.support.observed_app import make_app
from tests.support.procs import wait_until

PER_JOB = (
    "jobguard_enqueued_total",
    "jobguard_dedup_hits_total",
    "jobguard_retries_total",
    "jobguard_lock_busy_deferrals_total",
)
QUEUE_GAUGES = (
    "jobguard_queue_depth",
    "jobguard_queue_scheduled",
    "jobguard_jobs_in_flight",
    "jobguard_queue_oldest_age_seconds",
    "jobguard_dlq_size",
)


def test_a_worker_that_ran_no_job_serves_every_known_series_at_zero(
    store_url: str, served: list[Served]
) -> None:
    app = make_app(store_url)
    tasks = {(task.name, task.queue) for task in app.tasks.values()}
    app.close()
    worker = start_cli(
        store_url,
        ["--app", APP, "worker", "--queues", "default", "--metrics-port", "0"],
        "metrics at",
    )
    served.append(worker)

    samples = scrape(worker.url)

    for task, queue in tasks:
        labels = (("queue", queue), ("task", task))
        for outcome in Outcome:
            if outcome is Outcome.RUNNING:
                continue
            key = tuple(sorted((*labels, ("outcome", outcome.value))))
            assert samples["jobguard_deliveries_total"][key] == 0, (task, outcome)
        for name in PER_JOB:
            assert samples[name][labels] == 0, (name, task)
        for guard in ("lease", "fence"):
            key = tuple(sorted((*labels, ("guard", guard))))
            assert samples["jobguard_stale_refusals_total"][key] == 0
        assert samples["jobguard_handler_duration_seconds_count"][(("task", task),)] == 0
    for where in STORE_ERROR_PLACES:
        assert samples["jobguard_store_errors_total"][(("where", where),)] == 0
    assert samples["jobguard_lease_renewals_total"][()] == 0


def test_the_exporter_serves_every_known_queue_at_zero_and_keeps_a_drained_one(
    store_url: str, served: list[Served]
) -> None:
    app = make_app(store_url)
    queues = {task.queue for task in app.tasks.values()}
    exporter = start_cli(store_url, ["--app", APP, "exporter", "--port", "0"], "exporter serving")
    served.append(exporter)

    gauges = scrape(exporter.url)

    assert gauges["jobguard_store_up"][()] == 1
    for name in QUEUE_GAUGES:
        assert {dict(labels)["queue"]: v for labels, v in gauges[name].items()} == dict.fromkeys(
            queues, 0
        ), name

    # A queue of a task the exporter's app does not declare: shown while it holds a job, and
    # at zero once it drained (not gone, which an absence alert would take for a dead exporter).
    app.enqueue("note", {"text": "x"}, queue="side")
    wait_until(lambda: (("queue", "side"),) in scrape(exporter.url)["jobguard_queue_depth"])
    app.worker(["side"], install_signal_handlers=False).run(burst=True)
    drained = scrape(exporter.url)
    app.close()
    assert drained["jobguard_queue_depth"][(("queue", "side"),)] == 0
    assert drained["jobguard_dlq_size"][(("queue", "side"),)] == 0


def test_every_store_call_a_worker_or_scheduler_reports_is_served_from_zero() -> None:
    """The places a worker's fetch loop, pipeline, settler and heartbeat, and the scheduler,
    report store errors from are the ones served at 0: a place renamed (``ack`` became
    ``settle``) or added must not leave its series absent until its first failure."""
    parts = (worker, pipeline, settler, heartbeat, scheduler)
    source = "".join(inspect.getsource(part) for part in parts)
    reported = set(re.findall(r'store_error\(\s*"([a-z ]+)"', source))
    assert reported
    assert reported <= set(STORE_ERROR_PLACES)
