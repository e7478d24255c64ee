"""Bulk DLQ replay and purge on the dashboard over real HTTP (#17): preview, CSRF, audit, races."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from jobguard import App, DeadFilter, JobStatus
from jobguard.models import DeadCode, JobSpec
from tests.observability.conftest import Served
from tests.observability.test_dashboard_http import dashboard
from tests.support import stores
from tests.support.dead import Buried, bury, replayed_in_audit
from tests.support.observed_app import make_app


@pytest.fixture
def store(store_url: str) -> Iterator[App]:
    """The observed app on a fresh store of each backend."""
    app = make_app(store_url)
    yield app
    app.close()


def test_the_preview_shows_the_selection_and_each_form_acts_on_it(
    store: App, store_url: str, served: list[Served]
) -> None:
    """GET /dlq/bulk counts and lists; POST replays or purges exactly that, audited."""
    ids = bury(store, store_url, [Buried(task="mail")] * 3 + [Buried(task="bill")])
    client = dashboard(store_url, served)

    assert 'id="bulk-form"' in client.request("/dlq").body
    preview = client.request("/dlq/bulk?task=mail&queue=&reason=&since=&until=")
    assert preview.status == 200, preview.body
    assert "3 dead jobs match <strong>task=mail</strong>" in preview.body
    assert 'id="bulk-replay"' in preview.body
    assert 'id="bulk-purge"' in preview.body
    assert store.dlq.count(DeadFilter()) == 4
    form = client.form_fields("/dlq/bulk?task=mail", "/dlq/bulk/replay")
    assert set(form) == {"csrf", "task", "cutoff"}

    done = client.request("/dlq/bulk/replay", form=form)
    assert done.status == 200, done.body
    assert "Replayed 3 dead jobs" in done.body
    assert {store.get_job(i).status for i in ids[:3]} == {JobStatus.QUEUED}
    assert store.get_job(ids[3]).status == JobStatus.DEAD

    form = client.form_fields("/dlq/bulk?all=1", "/dlq/bulk/purge")
    purged = client.request("/dlq/bulk/purge", form=form)
    assert purged.status == 200, purged.body
    assert "Purged 1 dead job" in purged.body
    assert store.dlq.list() == []
    trail = store.audit_trail(10)
    assert [(e.action, e.target) for e in trail] == [
        ("purge-dead", "all dead jobs"),
        ("replay-dead", "task=mail"),
    ]
    assert all(e.actor == "local@127.0.0.1" for e in trail)


def test_a_bulk_post_without_its_csrf_token_is_refused_and_changes_nothing(
    store: App, store_url: str, served: list[Served]
) -> None:
    ids = bury(store, store_url, [Buried()] * 2)
    client = dashboard(store_url, served)
    client.request("/dlq")  # the browser cookie the token is tied to
    for action in ("replay", "purge"):
        reply = client.request(f"/dlq/bulk/{action}", form={"csrf": "0" * 64, "all": "1"})
        assert reply.status == 403
        assert "CSRF" in reply.body
    assert {store.get_job(i).status for i in ids} == {JobStatus.DEAD}
    assert store.audit_trail() == []


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("", "choose at least one filter"),
        ("task=mail&all=1", "selects them all"),
        ("reason=tired", "is not a dead code"),
        ("since=yesterday", "is not a time"),
        ("task=a%20b", "is not a valid task name"),
        ("colour=red", "unknown parameter"),
    ],
)
def test_a_bad_selection_is_a_400_page_and_changes_nothing(
    store: App, store_url: str, served: list[Served], query: str, message: str
) -> None:
    ids = bury(store, store_url, [Buried(task="mail")])
    client = dashboard(store_url, served)
    preview = client.request(f"/dlq/bulk?{query}")
    assert preview.status == 400, preview.body
    assert message in preview.body.replace("&#39;", "'")
    form = dict(pair.split("=") for pair in query.split("&") if pair)
    posted = client.request("/dlq/bulk/replay", form={"csrf": client.csrf("/dlq"), **form})
    assert posted.status == 400, posted.body
    assert "Traceback" not in posted.body
    assert store.get_job(ids[0]).status == JobStatus.DEAD
    assert store.audit_trail() == []


def test_two_dashboards_replaying_the_same_1000_jobs_at_once_replay_each_once(
    store: App, store_url: str, served: list[Served]
) -> None:
    """Acceptance 4 on the dashboard: two operators, two dashboard processes, one selection."""
    ids = bury(store, store_url, [Buried(code=DeadCode.EXHAUSTED)] * 1000)
    clients = [dashboard(store_url, served), dashboard(store_url, served)]
    forms = [
        client.form_fields("/dlq/bulk?reason=exhausted", "/dlq/bulk/replay") for client in clients
    ]
    replies: list[object] = [None, None]
    start = threading.Barrier(2)

    def post(n: int) -> None:
        start.wait()
        replies[n] = clients[n].request("/dlq/bulk/replay", form=forms[n])

    threads = [threading.Thread(target=post, args=(n,)) for n in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)

    assert [getattr(reply, "status", None) for reply in replies] == [200, 200]
    assert {store.get_job(i).status for i in ids} == {JobStatus.QUEUED}
    assert replayed_in_audit(store) == 1000
    assert len([e for e in store.audit_trail(10) if e.action == "replay-dead"]) == 2
    assert store.attempts(limit=10) == []


@pytest.mark.parametrize("action", ["replay", "purge"])
def test_the_confirm_acts_on_what_the_preview_showed_not_on_jobs_buried_since(
    store: App, store_url: str, served: list[Served], action: str
) -> None:
    """A job that dies between the preview and the click is not touched: the form carries the
    preview's store time and the action selects only jobs buried before it."""
    shown = bury(store, store_url, [Buried(task="mail")] * 2)
    client = dashboard(store_url, served)
    form = client.form_fields("/dlq/bulk?task=mail", f"/dlq/bulk/{action}")
    later = bury(store, store_url, [Buried(task="mail", at=store.backend.now())])
    assert store.dlq.count(DeadFilter(task="mail")) == 3

    done = client.request(f"/dlq/bulk/{action}", form=form)
    assert done.status == 200, done.body
    verb = "Replayed" if action == "replay" else "Purged"
    assert f"{verb} 2 dead jobs" in done.body
    assert store.get_job(later[0]).status == JobStatus.DEAD
    assert [job.id for job in store.dlq.list()] == later
    if action == "replay":
        assert {store.get_job(i).status for i in shown} == {JobStatus.QUEUED}
    [entry] = store.audit_trail(10)
    assert "as previewed at" in entry.detail


@pytest.mark.parametrize(
    ("cutoff", "message"),
    [(None, "no preview time"), ("soon", "cutoff must be"), ("1e9", "cutoff must be")],
)
def test_a_bulk_post_without_a_valid_preview_time_is_a_400_and_changes_nothing(
    store: App, store_url: str, served: list[Served], cutoff: str | None, message: str
) -> None:
    ids = bury(store, store_url, [Buried(task="mail")])
    client = dashboard(store_url, served)
    form = client.form_fields("/dlq/bulk?task=mail", "/dlq/bulk/replay")
    if cutoff is None:
        del form["cutoff"]
    else:
        form["cutoff"] = cutoff
    for action in ("replay", "purge"):
        reply = client.request(f"/dlq/bulk/{action}", form=form)
        assert reply.status == 400, reply.body
        assert message in reply.body
    assert store.get_job(ids[0]).status == JobStatus.DEAD
    assert store.audit_trail() == []


def test_the_preview_counts_the_jobs_a_replay_would_leave_dead_for_their_dedup_key(
    store: App, store_url: str, served: list[Served]
) -> None:
    """Held: a live job holds the key, or an earlier job of the selection (replayed first)."""
    keys = ["live", "twice", "twice", None, "own"]
    ids = bury(store, store_url, [Buried(task="mail")] * len(keys))
    table = stores.table(store_url, "jobs")  # one key on two dead jobs: set by hand
    stores.execute(
        store_url,
        [f"UPDATE {table} SET dedup_key = ? WHERE id = ?"],
        [(key, job_id) for key, job_id in zip(keys, ids, strict=True)],
    )
    store.backend.enqueue_many([JobSpec("mail", "default", "{}", 3, 30.0, dedup_key="live")])
    client = dashboard(store_url, served)
    preview = client.request("/dlq/bulk?task=mail")
    assert "5 dead jobs match" in preview.body
    assert "2 of them would stay dead on replay" in preview.body
    form = client.form_fields("/dlq/bulk?task=mail", "/dlq/bulk/replay")
    done = client.request("/dlq/bulk/replay", form=form)
    assert "Replayed 3 dead jobs" in done.body
    assert [store.get_job(i).status for i in ids] == [
        JobStatus.DEAD, JobStatus.QUEUED, JobStatus.DEAD, JobStatus.QUEUED, JobStatus.QUEUED
    ]  # fmt: skip
