"""The overview's Pause/Resume button over real HTTP: CSRF-protected and audited (#17)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from jobguard import App
from tests.observability.conftest import Client, Served, start_cli
from tests.observability.test_metrics import scrape
from tests.support.observed_app import make_app


@pytest.fixture
def store(store_url: str) -> Iterator[App]:
    app = make_app(store_url)
    app.enqueue("note", {"text": "hello"})
    yield app
    app.close()


def dashboard(url: str, served: list[Served]) -> Client:
    proc = start_cli(url, ["--url", url, "dashboard", "--port", "0"], "dashboard at")
    served.append(proc)
    return Client(proc.url)


def test_pause_and_resume_from_the_overview_are_done_audited_and_shown(
    store: App, store_url: str, served: list[Served]
) -> None:
    client = dashboard(store_url, served)
    page = client.request("/").body
    assert 'id="pause-notes"' in page
    for form in (None, {"csrf": ""}, {"csrf": "0" * 64}):
        refused = client.request("/queues/notes/pause", form=form, method="POST")
        assert refused.status == 403
    assert store.paused_queues() == []
    reply = client.request("/queues/notes/pause", form={"csrf": client.csrf("/")})
    assert (reply.status, reply.headers["location"]) == (303, "/?notice=paused")
    assert [s.queue for s in store.paused_queues()] == ["notes"]
    page = client.request("/").body
    assert 'id="resume-notes"' in page
    assert "paused" in page
    reply = client.request("/queues/notes/resume", form={"csrf": client.csrf("/")})
    assert (reply.status, reply.headers["location"]) == (303, "/?notice=resumed")
    assert store.paused_queues() == []
    trail = store.audit_trail()
    assert [(e.action, e.target) for e in trail] == [
        ("resume queue", "notes"),
        ("pause queue", "notes"),
    ]
    assert all(e.actor == "local@127.0.0.1" for e in trail)


def test_a_queue_name_that_is_not_valid_gets_a_400_and_changes_nothing(
    store: App, store_url: str, served: list[Served]
) -> None:
    client = dashboard(store_url, served)
    reply = client.request("/queues/a%20b/pause", form={"csrf": client.csrf("/")})
    assert reply.status == 400
    assert "is not a plain identifier" in reply.body
    assert store.paused_queues() == []
    assert store.audit_trail() == []


def test_the_exporter_shows_which_queues_are_paused(
    store: App, store_url: str, served: list[Served]
) -> None:
    store.pause_queue("notes", actor="operator")
    store.pause_queue("idle", actor="operator")  # paused before it ever had a job
    exporter = start_cli(
        store_url, ["--url", store_url, "exporter", "--port", "0"], "exporter serving"
    )
    served.append(exporter)
    paused = scrape(exporter.url)["jobguard_queue_paused"]
    assert paused[(("queue", "notes"),)] == 1
    assert paused[(("queue", "idle"),)] == 1
    store.resume_queue("notes", actor="operator")
    assert scrape(exporter.url)["jobguard_queue_paused"][(("queue", "notes"),)] == 0
