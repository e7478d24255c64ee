"""The dashboard over HTTP: bad input gets a 4xx page, logins, CSRF, escaping, the audit trail."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobguard import App
from jobguard.models import JobStatus
from tests.observability.conftest import Client, Served, start_cli
from tests.support.observed_app import make_app
from tests.support.procs import REPO_ROOT, clean_env, entry_point

TOKEN = "correct-horse-battery"


@pytest.fixture
def store(store_url: str) -> Iterator[App]:
    """The observed app's store with one dead job (id 1, with its attempt) and a queued one."""
    app = make_app(store_url)
    app.enqueue("flaky", {"n": 6})  # fatal: buried at its first attempt
    app.worker(install_signal_handlers=False).run(burst=True)
    app.enqueue("hold", {"n": 1})
    yield app
    app.close()


def dashboard(url: str, served: list[Served], *extra: str) -> Client:
    """Start ``jobguard dashboard`` on a free port and return a client for it."""
    proc = start_cli(
        url,
        ["--url", url, "dashboard", "--port", "0", *extra],
        "dashboard at",
    )
    served.append(proc)
    return Client(proc.url)


BAD_INPUT = [
    ("/jobs/424242", 404, "there is no job 424242"),
    ("/jobs/abc", 400, "the job id must be a whole number"),
    ("/jobs/-3", 400, "the job id must be a whole number"),
    ("/jobs/0", 400, "the job id must be from 1"),
    ("/jobs/99999999999999999999999999", 400, "the job id must be a whole number"),
    ("/jobs?page=0", 400, "page must be from 1 to 1000"),
    ("/jobs?page=-1", 400, "page must be a whole number"),
    ("/jobs?page=1000000000000", 400, "page must be from 1 to 1000"),
    ("/jobs?page=2.5", 400, "page must be a whole number"),
    ("/jobs?page=1&page=2", 400, "given 2 times"),
    ("/jobs?status=finished", 400, "status must be one of"),
    ("/jobs?queue=%3Cscript%3E", 400, "is not a valid queue name"),
    ("/jobs?task=a%20b", 400, "is not a valid task name"),
    ("/jobs?sort=id", 400, "unknown parameter"),
    ("/dlq?page=abc", 400, "page must be a whole number"),
    ("/operations?key=" + "k" * 600, 400, "at most 512 characters"),
    ("/operations?key=no-such-key", 404, "no operation record"),
    ("/dlq/1/replay", 405, "does not take that method"),
    ("/doctor?since=5", 400, "since (seconds) must be from 60"),
    ("/doctor?task=%00", 400, "is not a valid task name"),
    ("/?since=" + "9" * 3000, 400, "the query string is too long"),
    ("/no/such/page", 404, "no such page"),
    ("/jobs?" + "&".join(f"f{i}=1" for i in range(21)), 400, "too many query parameters"),
    ("/?" + "&".join(f"f{i}=1" for i in range(21)), 400, "too many query parameters"),
    ("/jobs/1?" + "&".join(f"f{i}=1" for i in range(21)), 400, "too many query parameters"),
    ("/login?" + "&".join(f"f{i}=1" for i in range(6)), 400, "at most 5"),
]


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Client]:
    """One dashboard for the read-only bad-input cases (starting one per case is slow)."""
    url = f"sqlite:///{tmp_path_factory.mktemp('bad-input') / 'jobs.db'}"
    app = make_app(url)
    app.enqueue("hold", {"n": 1})
    app.close()
    started: list[Served] = []
    try:
        yield dashboard(url, started)
    finally:
        for proc in started:
            proc.stop()


@pytest.mark.parametrize(("path", "status", "message"), BAD_INPUT)
def test_bad_input_gets_a_clear_4xx_page(
    shared: Client, path: str, status: int, message: str
) -> None:
    reply = shared.request(path)
    assert reply.status == status
    assert 'id="error-message"' in reply.body
    assert message in reply.body.replace("&#39;", "'")
    assert "Traceback" not in reply.body


def test_every_page_renders_and_allows_no_script(
    store: App, store_url: str, served: list[Served]
) -> None:
    client = dashboard(store_url, served)
    pages = ["/", "/jobs", "/jobs?status=dead&page=1", "/jobs/1", "/operations", "/dlq", "/audit"]
    for path in [*pages, "/operations?key=flaky:6", "/doctor", "/doctor?since=3600"]:
        reply = client.request(path)
        assert reply.status == 200, (path, reply.body)
        assert "script-src" not in reply.headers["content-security-policy"]
        assert "default-src 'none'" in reply.headers["content-security-policy"]
        assert "<script" not in reply.body.lower()


def test_a_post_without_its_csrf_token_is_refused_and_changes_nothing(
    store: App, store_url: str, served: list[Served]
) -> None:
    client = dashboard(store_url, served)
    client.request("/dlq")  # the browser cookie the token is tied to
    for form in (None, {"csrf": ""}, {"csrf": "0" * 64}):
        reply = client.request("/dlq/1/replay", form=form, method="POST")
        assert reply.status == 403
        assert "CSRF" in reply.body
    assert store.get_job(1).status == JobStatus.DEAD
    assert store.audit_trail() == []


def test_replay_and_purge_with_the_token_are_done_and_audited(
    store: App, store_url: str, served: list[Served]
) -> None:
    client = dashboard(store_url, served)
    reply = client.request("/dlq/1/replay", form={"csrf": client.csrf()})
    assert (reply.status, reply.headers["location"]) == (303, "/jobs/1?notice=replayed")
    assert store.get_job(1).status == JobStatus.QUEUED
    again = client.request("/dlq/1/replay", form={"csrf": client.csrf()})
    assert again.status == 404  # no longer dead
    store.worker(install_signal_handlers=False).run(burst=True)  # fatal again: dead again
    assert store.get_job(1).status == JobStatus.DEAD
    purged = client.request("/dlq/1/purge", form={"csrf": client.csrf()})
    assert (purged.status, purged.headers["location"]) == (303, "/dlq?notice=purged")
    trail = store.audit_trail()
    assert [(e.action, e.target) for e in trail] == [("purge", "job 1"), ("replay", "job 1")]
    assert all(e.actor == "local@127.0.0.1" for e in trail)
    assert "job 1" in client.request("/audit").body


def test_a_token_is_required_once_set_and_a_login_gives_a_session(
    store: App, store_url: str, served: list[Served]
) -> None:
    client = dashboard(store_url, served, "--token", TOKEN)
    assert client.request("/jobs").status == 303
    assert client.request("/dlq/1/replay", form={"csrf": "x"}).status == 403
    csrf = client.csrf("/login")
    wrong = client.request("/login", form={"csrf": csrf, "secret": "not-the-token", "next": "/"})
    assert wrong.status == 401
    outside = client.request(
        "/login", form={"csrf": csrf, "secret": TOKEN, "next": "//evil.example/"}
    )
    assert (outside.status, outside.headers["location"]) == (303, "/")  # no open redirect
    assert client.request("/jobs").status == 200
    scripted = Client(client.base).request("/jobs", headers={"Authorization": f"Bearer {TOKEN}"})
    assert scripted.status == 200


def test_the_dashboard_refuses_to_serve_the_network_without_a_login(db_path: Path) -> None:
    App(f"sqlite:///{db_path}").close()
    done = subprocess.run(
        [*entry_point(), "--url", f"sqlite:///{db_path}", "dashboard", "--host", "0.0.0.0"],
        cwd=REPO_ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 2
    assert "would be open to the network" in done.stderr


def test_job_arguments_errors_and_keys_are_escaped(store_url: str, served: list[Served]) -> None:
    app = make_app(store_url)
    job = app.enqueue(
        "reject",
        {"text": "<img src=x onerror=alert(1)>"},
        operation_key="<b>op</b>",
        dedup_key="<i>d</i>",
    )
    app.worker(install_signal_handlers=False).run(burst=True)
    client = dashboard(store_url, served)
    body = client.request(f"/jobs/{job.id}").body
    assert "<b>op</b>" not in body
    assert "&lt;b&gt;op&lt;/b&gt;" in body
    assert "<i>d</i>" not in body
    assert "<img src=x" not in body
    assert "&lt;img src=x onerror=alert(1)&gt;" in body
    app.close()
