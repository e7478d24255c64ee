"""Prometheus metrics: a worker's counters match the attempt log; the exporter reads the store."""

from __future__ import annotations

import urllib.request
from collections import Counter
from pathlib import Path

from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from jobguard import App, Context, JobStatus, Outcome
from jobguard.observability.metrics import OTHER, BoundedLabel, MetricsHooks
from tests.observability.conftest import APP, Served, kill_a_worker_mid_job, start_cli
from tests.support.observed_app import make_app
from tests.support.procs import wait_until

SURVIVOR = "survivor"


def scrape(url: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """``{sample name: {sorted labels: value}}`` of one scrape."""
    with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310 - our own local URL
        text = response.read().decode()
    samples: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = tuple(sorted(sample.labels.items()))
            samples.setdefault(sample.name, {})[labels] = sample.value
    return samples


def logged_outcomes(app: App, worker_id: str) -> Counter[tuple[str, str]]:
    """``(task, outcome) -> count`` of one worker's closed attempts in the attempt log."""
    return Counter(
        (a.task, a.outcome.value)
        for a in app.attempts(limit=100_000)
        if a.worker_id == worker_id and a.outcome != Outcome.RUNNING
    )


def outcomes(app: App, outcome: Outcome) -> int:
    """How many attempts of the log ended with ``outcome``."""
    return sum(a.outcome == outcome for a in app.attempts(limit=100_000))


def scraped_outcomes(
    samples: dict[str, dict[tuple[tuple[str, str], ...], float]],
) -> Counter[tuple[str, str]]:
    """``(task, outcome) -> count`` of ``jobguard_deliveries_total``."""
    found: Counter[tuple[str, str]] = Counter()
    for labels, value in samples.get("jobguard_deliveries_total", {}).items():
        named = dict(labels)
        found[(named["task"], named["outcome"])] += int(value)
    return found


def total(samples: dict[str, dict[tuple[tuple[str, str], ...], float]], name: str) -> int:
    """The sum of a metric over all its label sets."""
    return int(sum(samples.get(name, {}).values()))


def test_a_scrape_after_kills_and_retries_matches_the_attempt_log(
    store_url: str, served: list[Served]
) -> None:
    producer = make_app(store_url)
    stalled = [producer.enqueue("stall", {"n": n}) for n in range(3)]

    # A victim worker leases the stalling jobs and is SIGKILLed while they run.
    kill_a_worker_mid_job(store_url, producer, len(stalled))

    for n in range(21):
        producer.enqueue("flaky", {"n": n})
    for n in range(6):
        producer.enqueue("hold", {"n": n})

    worker = start_cli(
        store_url,
        ["--app", APP, "worker", "--queues", "default,crashing", "--concurrency", "4",
         "--worker-id", SURVIVOR, "--metrics-port", "0"],
        "metrics at",
    )  # fmt: skip
    served.append(worker)

    def settled() -> bool:
        counts = producer.counts()
        return counts["queued"] == 0 and counts["running"] == 0

    wait_until(settled, timeout_s=60)
    logged = logged_outcomes(producer, SURVIVOR)
    # Every closed attempt is counted once its hook ran; wait for the last ack's hook.
    wait_until(lambda: sum(scraped_outcomes(scrape(worker.url)).values()) >= sum(logged.values()))
    samples = scrape(worker.url)

    assert scraped_outcomes(samples) == logged
    # What makes this run worth comparing: kills, retries and burials really happened.
    assert outcomes(producer, Outcome.LOST) == len(stalled)
    assert logged[("flaky", "retry")] > 0
    assert logged[("flaky", "dead")] > 0
    assert total(samples, "jobguard_retries_total") == sum(
        n for (_, outcome), n in logged.items() if outcome == "retry"
    )
    assert total(samples, "jobguard_lock_busy_deferrals_total") == sum(
        n for (_, outcome), n in logged.items() if outcome == "deferred"
    )
    runs = sum(n for (_, outcome), n in logged.items() if outcome in {"completed", "retry", "dead"})
    assert total(samples, "jobguard_handler_duration_seconds_count") == runs

    # The exporter reads the same store: nothing queued, the dead jobs in the DLQ.
    exporter = start_cli(
        store_url, ["--url", store_url, "exporter", "--port", "0"], "exporter serving"
    )
    served.append(exporter)
    gauges = scrape(exporter.url)
    dead = producer.counts()[JobStatus.DEAD]
    assert total(gauges, "jobguard_dlq_size") == dead > 0
    assert total(gauges, "jobguard_queue_depth") == 0
    assert total(gauges, "jobguard_jobs_in_flight") == 0
    assert gauges["jobguard_store_up"][()] == 1
    producer.close()


def test_enqueues_and_dedup_hits_are_counted_by_task_and_queue(tmp_path: Path) -> None:
    metrics = MetricsHooks(CollectorRegistry())
    app = App(f"sqlite:///{tmp_path / 'm.db'}", hooks=metrics)

    @app.task(queue="mail")
    def send(ctx: Context, to: str) -> None: ...

    send.options(dedup_key="welcome:ana").enqueue(to="ana")
    send.options(dedup_key="welcome:ana").enqueue(to="ana")
    send.enqueue_many([{"to": "bo"}, {"to": "cy"}])
    labels = {"task": send.name, "queue": "mail"}
    assert metrics.registry.get_sample_value("jobguard_enqueued_total", labels) == 3
    assert metrics.registry.get_sample_value("jobguard_dedup_hits_total", labels) == 1
    app.close()


def test_label_values_beyond_the_bound_are_reported_as_other() -> None:
    label = BoundedLabel(limit=2)
    assert [label(v) for v in ("a", "b", "c", "a", "d")] == ["a", "b", OTHER, "a", OTHER]
