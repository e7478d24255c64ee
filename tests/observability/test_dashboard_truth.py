"""What the dashboard says matches the store: its overview after every job completed."""

from __future__ import annotations

from jobguard.models import JobStatus
from tests.observability.conftest import Client, Served, start_cli
from tests.support.observed_app import make_app


def test_the_overview_does_not_say_no_job_yet_after_jobs_completed(
    store_url: str, served: list[Served]
) -> None:
    """Every job completed, none waits or runs: the queue table is empty, and says so truthfully
    (nothing waiting, running or dead; how many completed), not "no queue has a job yet"."""
    app = make_app(store_url)
    try:
        for n in range(3):
            app.enqueue("note", {"text": f"n{n}"})
        app.worker(["notes"], install_signal_handlers=False).run(burst=True)
        assert app.counts()[JobStatus.COMPLETED] == 3
    finally:
        app.close()
    proc = start_cli(store_url, ["--url", store_url, "dashboard", "--port", "0"], "dashboard at")
    served.append(proc)

    body = Client(proc.url).request("/").body

    assert "no queue has a job yet" not in body
    assert "no job is waiting, running or dead; 3 completed" in body
