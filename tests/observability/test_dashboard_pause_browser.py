"""The overview's Pause/Resume button clicked in a real headless Chromium (#17). The screenshot
of a paused queue on the overview in ``docs/dashboard.md`` is taken here."""

from __future__ import annotations

from pathlib import Path

from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from jobguard import App
from jobguard.models import JobStatus
from tests.observability.conftest import Served, start_cli
from tests.observability.test_dashboard_browser import (  # noqa: F401 - the browser fixture
    TOKEN,
    browser,
    images,
    submit,
    text_of,
)
from tests.support.observed_app import make_app


def test_an_operator_pauses_and_resumes_a_queue_from_the_overview(
    db_path: Path,
    served: list[Served],
    browser: WebDriver,  # noqa: F811
    images: Path,  # noqa: F811
) -> None:
    url = f"sqlite:///{db_path}"  # one backend: the HTTP tests cover the routes on both
    app: App = make_app(url)
    first = app.enqueue("hold", {"n": 0})  # the queue shows on the overview once it has a job
    dashboard = start_cli(
        url, ["--url", url, "dashboard", "--port", "0", "--token", TOKEN], "dashboard at"
    )
    served.append(dashboard)
    base = dashboard.url
    browser.get(f"{base}/")
    browser.find_element(By.ID, "secret").send_keys(TOKEN)
    submit(browser, "login")
    assert text_of(browser, "#queue-default .state").startswith("active")

    submit(browser, "pause-default")
    assert browser.current_url == f"{base}/?notice=paused"
    assert text_of(browser, "#notice") == "Queue paused."
    assert text_of(browser, "#queue-default .state").startswith("paused")
    images.mkdir(exist_ok=True)
    browser.save_screenshot(str(images / "dashboard-queue-paused.png"))
    held = app.enqueue("hold", {"n": 1})  # lands while paused, and waits
    app.worker(install_signal_handlers=False).run(burst=True)
    assert [app.get_job(j.id).status for j in (first, held)] == [JobStatus.QUEUED] * 2

    browser.get(f"{base}/")
    submit(browser, "resume-default")
    assert text_of(browser, "#notice") == "Queue resumed."
    assert text_of(browser, "#queue-default .state").startswith("active")
    app.worker(install_signal_handlers=False).run(burst=True)
    assert [app.get_job(j.id).status for j in (first, held)] == [JobStatus.COMPLETED] * 2

    browser.get(f"{base}/audit")
    body = browser.find_element(By.TAG_NAME, "body").text
    assert "resume queue" in body
    assert "pause queue" in body
    assert [(e.action, e.target) for e in app.audit_trail()] == [
        ("resume queue", "default"),
        ("pause queue", "default"),
    ]
    app.close()
