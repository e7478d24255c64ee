"""The job page's Cancel button clicked in a real headless Chromium (#17). The screenshot of
the job page with its Cancel button in ``docs/dashboard.md`` is taken here."""

from __future__ import annotations

from pathlib import Path

from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from jobguard import App
from jobguard.models import DeadCode, JobStatus
from tests.observability.conftest import Served, serve_dashboard
from tests.observability.test_dashboard_browser import (  # noqa: F401 - the browser fixture
    TOKEN,
    browser,
    images,
    submit,
    text_of,
)
from tests.support.observed_app import make_app


def test_an_operator_cancels_a_scheduled_job_from_its_page(
    db_path: Path,
    served: list[Served],
    browser: WebDriver,  # noqa: F811
    images: Path,  # noqa: F811
) -> None:
    url = f"sqlite:///{db_path}"  # one backend: the HTTP tests cover the route on both
    app: App = make_app(url)
    job = app.tasks["hold"].options(delay_s=3600).enqueue(n=0)
    base = serve_dashboard(url, served, "--token", TOKEN)
    browser.get(f"{base}/jobs/{job.id}")
    browser.find_element(By.ID, "secret").send_keys(TOKEN)
    submit(browser, "login")
    browser.get(f"{base}/jobs/{job.id}")
    assert text_of(browser, "#job-status") == "queued"
    images.mkdir(exist_ok=True)
    browser.save_screenshot(str(images / "dashboard-job-cancel.png"))

    submit(browser, "cancel")
    assert browser.current_url == f"{base}/jobs/{job.id}?notice=cancelled"
    assert text_of(browser, "#notice").startswith("Cancelled: the job will not run")
    assert text_of(browser, "#job-status") == "dead"
    assert browser.find_elements(By.ID, "cancel") == []
    got = app.get_job(job.id)
    assert (got.status, got.dead_code) == (JobStatus.DEAD, DeadCode.CANCELLED)
    app.worker(install_signal_handlers=False).run(burst=True)
    assert app.attempts(job_id=job.id) == []  # it never ran

    browser.get(f"{base}/audit")
    assert "cancel job" in browser.find_element(By.TAG_NAME, "body").text
    (entry,) = app.audit_trail()
    assert (entry.action, entry.target) == ("cancel job", f"job {job.id}")
    assert entry.actor != ""
    app.close()
