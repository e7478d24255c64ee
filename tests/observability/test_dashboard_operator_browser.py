"""Operator actions clicked in a real headless Chromium (#17): a bulk DLQ replay (filter,
preview, confirm, result) and retry-now on a job page. The screenshots of these actions in
``docs/dashboard.md`` are taken here (``JOBGUARD_UPDATE_SCREENSHOTS=1`` writes them into
``docs/images/``, as the other browser tests do)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.select import Select

from jobguard import App
from jobguard.models import DeadCode, JobStatus
from tests.observability.conftest import Served, start_cli
from tests.observability.test_dashboard_browser import (  # noqa: F401 - the fixtures
    TOKEN,
    browser,
    images,
    submit,
    text_of,
)
from tests.support.dead import Buried, bury
from tests.support.queue_app import BACKOFF, LONG_BACKOFF_S, make_app


@pytest.fixture
def store(db_path: Path) -> Iterator[tuple[str, App]]:
    """The queue fault tests' app on a SQLite file (one backend: the HTTP tests of these
    routes run on both)."""
    url = f"sqlite:///{db_path}"
    app = make_app(url)
    yield url, app
    app.close()


def logged_in(url: str, served: list[Served], browser: WebDriver, path: str) -> str:  # noqa: F811
    """Start a dashboard with a token, log in on ``path`` and return the dashboard's address."""
    dashboard = start_cli(
        url, ["--url", url, "dashboard", "--port", "0", "--token", TOKEN], "dashboard at"
    )
    served.append(dashboard)
    browser.get(f"{dashboard.url}{path}")
    browser.find_element(By.ID, "secret").send_keys(TOKEN)
    submit(browser, "login")
    return dashboard.url


def test_an_operator_replays_the_dead_jobs_of_an_outage_from_a_filtered_preview(
    store: tuple[str, App],
    served: list[Served],
    browser: WebDriver,  # noqa: F811
    images: Path,  # noqa: F811
) -> None:
    url, app = store
    an_hour_ago = app.backend.now() - 3600
    outage = bury(app, url, [Buried(task="send_mail", queue="mail", at=an_hour_ago)] * 12)
    others = bury(app, url, [Buried(task="charge", code=DeadCode.FATAL, at=an_hour_ago)] * 3)
    base = logged_in(url, served, browser, "/dlq")

    # Filter: the mail outage's jobs, spent their attempts.
    browser.find_element(By.NAME, "task").send_keys("send_mail")
    Select(browser.find_element(By.NAME, "reason")).select_by_visible_text("exhausted")
    submit(browser, "bulk-preview")
    assert browser.current_url.startswith(f"{base}/dlq/bulk?")
    assert text_of(browser, "#selection").startswith(
        "12 dead jobs match task=send_mail reason=exhausted"
    )
    assert len(browser.find_elements(By.CSS_SELECTOR, "#jobs tr")) == 1 + 10  # header, 10 rows
    assert "buried after this page was made" in text_of(browser, "#cutoff")
    images.mkdir(exist_ok=True)
    browser.save_screenshot(str(images / "dashboard-dlq-bulk-preview.png"))

    # A job of the same kind dies while the operator reads the preview: not theirs to replay.
    [late] = bury(app, url, [Buried(task="send_mail", queue="mail", at=app.backend.now())])

    submit(browser, "bulk-replay")
    assert text_of(browser, "h1") == "Replayed 12 dead jobs"
    assert "task=send_mail reason=exhausted as previewed at" in text_of(browser, "#notice")
    browser.save_screenshot(str(images / "dashboard-dlq-bulk-done.png"))
    assert {app.get_job(i).status for i in outage} == {JobStatus.QUEUED}
    assert {app.get_job(i).status for i in [*others, late]} == {JobStatus.DEAD}

    browser.get(f"{base}/audit")
    audit = text_of(browser, "#audit")
    assert "replay-dead" in audit
    assert "12 replayed, 0 held, 0 already gone; as previewed at" in audit
    [entry] = app.audit_trail()
    assert entry.actor.startswith("token@")


def test_an_operator_runs_a_job_waiting_on_a_long_backoff_now(
    store: tuple[str, App],
    served: list[Served],
    images: Path,  # noqa: F811
    browser: WebDriver,  # noqa: F811
) -> None:
    url, app = store
    job = app.enqueue(BACKOFF, {})
    app.worker(install_signal_handlers=False).run(burst=True)  # attempt 1: back in an hour
    waiting = app.get_job(job.id)
    assert (waiting.status, waiting.attempts) == (JobStatus.QUEUED, 1)
    assert waiting.run_at > app.backend.now() + LONG_BACKOFF_S - 60
    base = logged_in(url, served, browser, f"/jobs/{job.id}")

    assert text_of(browser, "#waiting").startswith("Waiting to run until")
    assert "attempt 1/3 so far" in text_of(browser, "#waiting")
    images.mkdir(exist_ok=True)
    browser.save_screenshot(str(images / "dashboard-retry-now.png"))

    submit(browser, "retry-now")
    assert browser.current_url == f"{base}/jobs/{job.id}?notice=retried"
    assert text_of(browser, "#notice").startswith("Retry now: the job is due")
    assert browser.find_elements(By.ID, "retry-now") == []
    app.worker(install_signal_handlers=False).run(burst=True)  # due now: it runs
    browser.get(f"{base}/jobs/{job.id}")
    assert text_of(browser, "#job-status") == "completed"
    assert app.get_job(job.id).attempts == 2
    [entry] = app.audit_trail()
    assert (entry.action, entry.target) == ("retry-now", f"job {job.id}")
    assert entry.actor.startswith("token@")
