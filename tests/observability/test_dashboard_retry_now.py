"""The job page's Retry now button over real HTTP (#17): CSRF, audit, refusals, bad ids."""

from __future__ import annotations

import pytest

from jobguard import App, JobStatus
from tests.e2e.test_retry_now import REFUSED
from tests.e2e.test_retry_now import app as store  # noqa: F401 - the fixture
from tests.observability.conftest import Served
from tests.observability.test_dashboard_http import dashboard
from tests.support.queue_app import NOOP


def test_the_button_makes_a_waiting_job_due_now_audited_with_the_login(
    store: App,  # noqa: F811
    store_url: str,
    served: list[Served],
) -> None:
    waiting = store.tasks[NOOP].options(delay_s=3600.0).enqueue()
    client = dashboard(store_url, served)
    page = client.request(f"/jobs/{waiting.id}")
    assert 'id="retry-now"' in page.body
    assert "Waiting to run until" in page.body
    form = client.form_fields(f"/jobs/{waiting.id}", f"/jobs/{waiting.id}/retry-now")

    reply = client.request(f"/jobs/{waiting.id}/retry-now", form=form)

    assert (reply.status, reply.headers["location"]) == (
        303,
        f"/jobs/{waiting.id}?notice=retried",
    )
    moved = store.get_job(waiting.id)
    assert moved.run_at <= store.backend.now()
    assert (moved.status, moved.attempts) == (JobStatus.QUEUED, 0)
    after = client.request(f"/jobs/{waiting.id}?notice=retried")
    assert "Retry now: the job is due" in after.body
    assert 'id="retry-now"' not in after.body  # due now: nothing left to hurry
    [entry] = store.audit_trail()
    assert (entry.actor, entry.action, entry.target) == (
        "local@127.0.0.1",
        "retry-now",
        f"job {waiting.id}",
    )


def test_a_post_without_its_csrf_token_is_refused_and_changes_nothing(
    store: App,  # noqa: F811
    served: list[Served],
    store_url: str,
) -> None:
    waiting = store.tasks[NOOP].options(delay_s=3600.0).enqueue()
    client = dashboard(store_url, served)
    client.request("/")  # the browser cookie the token is tied to
    for form in ({"csrf": ""}, {"csrf": "0" * 64}):
        reply = client.request(f"/jobs/{waiting.id}/retry-now", form=form)
        assert reply.status == 403
    assert store.get_job(waiting.id) == waiting
    assert store.audit_trail() == []


@pytest.mark.parametrize(("make", "message"), REFUSED, ids=["due", "running", "completed", "dead"])
def test_a_job_not_waiting_is_a_409_page_and_is_left_as_it_was(
    store: App,  # noqa: F811
    store_url: str,
    served: list[Served],
    make: object,
    message: str,
) -> None:
    job_id = make(store)  # type: ignore[operator]
    before = store.get_job(job_id)
    client = dashboard(store_url, served)
    assert 'id="retry-now"' not in client.request(f"/jobs/{job_id}").body
    reply = client.request(f"/jobs/{job_id}/retry-now", form={"csrf": client.csrf()})
    assert reply.status == 409, reply.body
    assert message in reply.body
    assert store.get_job(job_id) == before
    assert store.audit_trail() == []


@pytest.mark.parametrize(
    ("path", "status", "message"),
    [
        ("424242", 404, "no job with id 424242"),
        ("abc", 400, "the job id must be a whole number"),
        ("0", 400, "the job id must be from 1"),
        ("99999999999999999999999", 400, "the job id must be a whole number"),
    ],
)
def test_a_bad_or_unknown_id_is_a_clear_error_page_and_changes_nothing(
    store: App,  # noqa: F811
    store_url: str,
    served: list[Served],
    path: str,
    status: int,
    message: str,
) -> None:
    waiting = store.tasks[NOOP].options(delay_s=3600.0).enqueue()
    client = dashboard(store_url, served)
    reply = client.request(f"/jobs/{path}/retry-now", form={"csrf": client.csrf()})
    assert reply.status == status, reply.body
    assert message in reply.body
    assert "Traceback" not in reply.body
    assert store.get_job(waiting.id) == waiting
    assert store.audit_trail() == []
