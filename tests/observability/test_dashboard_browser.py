"""The dashboard in a real headless Chromium, driven with selenium.

Needs Debian's ``chromium`` and ``chromium-driver`` (``.ci/run`` installs them). Without them
these tests are skipped with that reason, unless ``JOBGUARD_REQUIRE_BROWSER=1`` (``.ci/run`` sets
it): then a missing or broken browser fails them, so CI cannot pass with them unrun. With
``JOBGUARD_UPDATE_SCREENSHOTS=1`` the run writes the screenshots ``docs/dashboard.md`` shows
into ``docs/images/``; otherwise into the test's own temporary directory, so a test run leaves
the checkout as it was.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import pytest
from selenium import webdriver
from selenium.common.exceptions import WebDriverException
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.wait import WebDriverWait

from jobguard import App
from jobguard.models import JobStatus
from tests.observability.conftest import APP, Served, kill_a_worker_mid_job, start_cli
from tests.support.observed_app import make_app
from tests.support.procs import REPO_ROOT, wait_until

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
NO_BROWSER = (
    "needs Debian's chromium and chromium-driver (apt-get install chromium chromium-driver)"
)
BROWSER_REQUIRED = os.environ.get("JOBGUARD_REQUIRE_BROWSER") == "1"
DOCS_IMAGES = REPO_ROOT / "docs" / "images"
TOKEN = "browser-test-token"
SCRIPT = "<script>document.title='pwned';window.pwned=1</script>"


def _unavailable(reason: str) -> NoReturn:
    """No browser to drive: a failure where one is required, a skip with the reason elsewhere."""
    if BROWSER_REQUIRED:
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.fixture
def browser() -> Iterator[WebDriver]:
    """Headless Chromium at a fixed window size (so screenshots are comparable)."""
    if CHROMIUM is None or CHROMEDRIVER is None:
        _unavailable(NO_BROWSER)
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                     "--disable-gpu", "--window-size=1280,900", "--hide-scrollbars"):  # fmt: skip
        options.add_argument(argument)
    service = webdriver.ChromeService(executable_path=str(CHROMEDRIVER))
    try:
        driver = webdriver.Chrome(options=options, service=service)
    except WebDriverException as exc:
        _unavailable(f"chromium did not start: {exc.msg}")
    try:
        yield driver
    finally:
        driver.quit()


LEFT_MARK = "window.__jobguardLeaving"


def submit(driver: WebDriver, element_id: str) -> None:
    """Click a form's button and wait until the browser shows the page the form led to.

    The old document is marked from JavaScript and the wait ends once a loaded document without
    the mark is there. Waiting on an old element going stale instead races with the navigation:
    Chromium may answer a question about a node being detached with an inspector error rather
    than a stale-element one.
    """
    driver.execute_script(f"{LEFT_MARK} = true")
    driver.find_element(By.ID, element_id).click()
    WebDriverWait(driver, 30).until(_on_a_new_loaded_page)


def _on_a_new_loaded_page(driver: WebDriver) -> bool:
    try:
        return bool(
            driver.execute_script(
                f"return {LEFT_MARK} === undefined && document.readyState === 'complete'"
            )
        )
    except WebDriverException:  # asked mid-navigation: not there yet
        return False


def text_of(driver: WebDriver, css: str) -> str:
    """The visible text of the first element matching ``css``."""
    return str(driver.find_element(By.CSS_SELECTOR, css).text)


@pytest.fixture
def images(tmp_path: Path) -> Path:
    """Where the screenshots go: the docs' images only when asked to update them."""
    if os.environ.get("JOBGUARD_UPDATE_SCREENSHOTS") == "1":
        return DOCS_IMAGES
    return tmp_path / "images"


def test_an_operator_logs_in_watches_a_queue_drain_and_replays_a_dead_job(
    db_path: Path, served: list[Served], browser: WebDriver, images: Path
) -> None:
    url = f"sqlite:///{db_path}"  # one backend: the HTTP tests cover the pages on every one
    producer: App = make_app(url)
    stalled = producer.enqueue("stall", {"n": 1})
    note = producer.enqueue("note", {"text": SCRIPT})
    dashboard = start_cli(
        url,
        ["--url", url, "dashboard", "--port", "0", "--token", TOKEN],
        "dashboard at",
    )
    served.append(dashboard)
    base = dashboard.url

    # Log in: any page sends us to the login form first.
    browser.get(f"{base}/jobs")
    assert "/login" in browser.current_url
    browser.find_element(By.ID, "secret").send_keys("not the token")
    submit(browser, "login")
    assert browser.find_element(By.ID, "login-failed").is_displayed()
    browser.find_element(By.ID, "secret").send_keys(TOKEN)
    submit(browser, "login")
    assert browser.current_url == f"{base}/jobs"

    # A SIGKILLed delivery: a victim worker leases the stalling job and dies with it.
    kill_a_worker_mid_job(url, producer, 1)

    # The queue fills...
    for n in range(24):
        producer.enqueue("flaky", {"n": n})
    for n in range(16):
        producer.enqueue("hold", {"n": n})
    browser.get(f"{base}/")
    assert int(text_of(browser, "#queue-default .depth")) == 40

    # ...and drains under a worker that also takes over the killed delivery.
    worker = start_cli(
        url,
        ["--app", APP, "worker", "--queues", "default,crashing", "--concurrency", "4"],
        "worker ",
    )
    served.append(worker)

    def drained() -> bool:
        counts = producer.counts()
        return counts[JobStatus.QUEUED] == 1 and counts[JobStatus.RUNNING] == 0  # the note

    wait_until(drained, timeout_s=60)
    worker.stop()  # a replayed job must stay where the replay put it
    browser.get(f"{base}/?since=120")
    assert int(text_of(browser, "#queue-default .depth")) == 0
    assert int(text_of(browser, "#queue-default .running")) == 0
    images.mkdir(exist_ok=True)
    browser.save_screenshot(str(images / "dashboard-overview.png"))

    # The killed delivery's job: its timeline shows the lost attempt, then the one that ran.
    browser.get(f"{base}/jobs/{stalled.id}")
    outcomes = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#attempts .outcome")]
    assert outcomes == ["lost", "completed"]
    assert "victim-1" in text_of(browser, "#attempts")
    # The lost attempt is not drawn as a run that lasted its whole lease: only its start is
    # solid; the span until the takeover is an outline, what is not known.
    lost_bar, ran_bar = browser.find_elements(By.CSS_SELECTOR, "#timeline rect.run")
    assert float(lost_bar.get_attribute("width") or 0) <= 4
    [unknown] = browser.find_elements(By.CSS_SELECTOR, "#timeline rect.unknown")
    assert unknown.get_attribute("fill") == "none"
    assert float(unknown.get_attribute("width") or 0) > float(lost_bar.get_attribute("width") or 0)
    assert "stopped reporting" in (unknown.get_attribute("textContent") or "")
    assert float(ran_bar.get_attribute("width") or 0) > 0
    browser.save_screenshot(str(images / "dashboard-job-timeline.png"))

    # The duration histogram with the visibility timeout and lock TTL drawn across it.
    browser.get(f"{base}/doctor")
    histogram = browser.find_element(By.ID, "histogram-hold")
    assert "visibility timeout 2.0 s" in histogram.text
    assert "lock TTL 1.5 s" in histogram.text
    browser.execute_script("arguments[0].scrollIntoView()", histogram)
    histogram.screenshot(str(images / "dashboard-histogram.png"))

    # A dead job: a replay whose form lost its CSRF token is refused; with it, it is done.
    dead = producer.find_jobs(status=JobStatus.DEAD)
    assert dead
    target = dead[0].id
    browser.get(f"{base}/dlq")
    browser.execute_script("document.querySelectorAll('input[name=csrf]').forEach(e => e.remove())")
    submit(browser, f"replay-{target}")
    assert text_of(browser, "#error-status") == "403"
    assert "CSRF" in text_of(browser, "#error-message")
    assert producer.get_job(target).status == JobStatus.DEAD
    browser.get(f"{base}/dlq")
    submit(browser, f"replay-{target}")
    assert browser.current_url == f"{base}/jobs/{target}?notice=replayed"
    assert browser.find_element(By.ID, "notice").is_displayed()
    assert producer.get_job(target).status == JobStatus.QUEUED
    browser.get(f"{base}/audit")
    assert f"job {target}" in text_of(browser, "#audit")

    # Arguments holding a script tag are shown as text and never run.
    browser.get(f"{base}/jobs/{note.id}")
    assert SCRIPT in text_of(browser, "#payload")
    assert browser.execute_script("return window.pwned") is None
    assert browser.title != "pwned"
    producer.close()
