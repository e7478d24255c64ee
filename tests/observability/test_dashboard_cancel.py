"""The job page's Cancel button over real HTTP on both stores: CSRF-protected, audited (#17)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from jobguard import App
from jobguard.models import DeadCode, JobStatus
from tests.observability.conftest import Client, Served, serve_dashboard
from tests.support.observed_app import make_app

ACTOR = "local@127.0.0.1"  # a dashboard without a login: the client's address


@pytest.fixture
def store(store_url: str) -> Iterator[App]:
    """The observed app, with no job yet."""
    app = make_app(store_url)
    yield app
    app.close()


def test_cancel_from_the_job_page_buries_a_queued_job_and_asks_a_running_one_to_stop(
    store: App, store_url: str, served: list[Served]
) -> None:
    queued = store.enqueue("note", {"text": "hello"})
    client = Client(serve_dashboard(store_url, served))
    page = client.request(f"/jobs/{queued.id}").body
    assert 'id="cancel"' in page
    for form in (None, {"csrf": ""}, {"csrf": "0" * 64}):
        refused = client.request(f"/jobs/{queued.id}/cancel", form=form, method="POST")
        assert refused.status == 403
    assert store.get_job(queued.id).status == JobStatus.QUEUED
    reply = client.request(f"/jobs/{queued.id}/cancel", form={"csrf": client.csrf("/")})
    assert (reply.status, reply.headers["location"]) == (
        303,
        f"/jobs/{queued.id}?notice=cancelled",
    )
    job = store.get_job(queued.id)
    assert (job.status, job.dead_code) == (JobStatus.DEAD, DeadCode.CANCELLED)
    page = client.request(f"/jobs/{queued.id}?notice=cancelled").body
    assert "Cancelled: the job will not run" in page
    assert 'id="cancel"' not in page
    assert 'id="replay"' in page  # a cancelled job is dead: it can be replayed

    # A running job (leased by a worker): the cancel is recorded for its worker to read.
    running = store.enqueue("note", {"text": "busy"})
    (leased,) = store.backend.fetch_prepared(["notes"], 1, "w1")
    assert leased.delivery.job_id == running.id
    reply = client.request(f"/jobs/{running.id}/cancel", form={"csrf": client.csrf("/")})
    assert reply.headers["location"] == f"/jobs/{running.id}?notice=cancel-requested"
    job = store.get_job(running.id)
    assert (job.status, job.cancel_requested_by) == (JobStatus.RUNNING, ACTOR)
    page = client.request(f"/jobs/{running.id}").body
    assert 'id="cancel-request"' in page
    assert 'id="cancel"' not in page

    # A finished job: 409, nothing changed.
    again = client.request(f"/jobs/{queued.id}/cancel", form={"csrf": client.csrf("/")})
    assert again.status == 409
    assert "only a queued, scheduled or running job can be cancelled" in again.body
    missing = client.request("/jobs/999999/cancel", form={"csrf": client.csrf("/")})
    assert missing.status == 404
    bad = client.request("/jobs/x/cancel", form={"csrf": client.csrf("/")})
    assert bad.status == 400
    trail = store.audit_trail()
    assert [(e.action, e.target, e.actor) for e in trail] == [
        ("cancel job", f"job {running.id}", ACTOR),
        ("cancel job", f"job {queued.id}", ACTOR),
    ]
