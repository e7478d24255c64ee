"""The exporter keeps the queue label bounded: 200 queues by name, the rest summed as ``other``.

A real ``jobguard exporter`` process over a store holding jobs of 1,000 queues, scraped over
HTTP, on both backends (#18).
"""

from __future__ import annotations

from jobguard import App, Context
from jobguard.observability.metrics import MAX_LABEL_VALUES, OTHER
from tests.observability.conftest import Served, start_cli
from tests.observability.test_metrics import scrape

QUEUES = 1000


def test_a_thousand_queues_give_200_label_values_and_other(
    store_url: str, served: list[Served]
) -> None:
    app = App(store_url)
    try:

        @app.task(name="noop")
        def noop(ctx: Context, n: int) -> None:
            """Never run: the jobs only fill queues."""

        for n in range(QUEUES):
            noop.options(queue=f"q{n:04d}").enqueue(n=n)
        noop.options(queue="q0999").enqueue(n=-1)  # a second job in a folded queue
    finally:
        app.close()
    exporter = start_cli(
        store_url, ["--url", store_url, "exporter", "--port", "0"], "exporter serving"
    )
    served.append(exporter)
    samples = scrape(exporter.url)
    for name in ("jobguard_queue_depth", "jobguard_dlq_size", "jobguard_jobs_in_flight"):
        queues = {dict(labels)["queue"] for labels in samples[name]}
        assert len(queues) == MAX_LABEL_VALUES + 1, name
        assert OTHER in queues
        assert sorted(queues - {OTHER}) == [f"q{n:04d}" for n in range(MAX_LABEL_VALUES)]
    depth = {
        dict(labels)["queue"]: value for labels, value in samples["jobguard_queue_depth"].items()
    }
    assert depth["q0000"] == 1
    assert depth[OTHER] == QUEUES - MAX_LABEL_VALUES + 1
    assert sum(depth.values()) == QUEUES + 1
