"""Where the browser is required (``JOBGUARD_REQUIRE_BROWSER=1``, as ``.ci/run`` sets it), a
machine without Chromium fails the dashboard's browser tests instead of skipping them; elsewhere
they are skipped with the reason. Run in a child pytest whose ``PATH`` finds no browser."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.procs import REPO_ROOT, clean_env

BROWSER_TEST = "tests/observability/test_dashboard_pause_browser.py"


def run_without_a_browser(tmp_path: Path, *, required: bool) -> tuple[int, str]:
    """The child run's exit status and its summary line."""
    env = clean_env()
    env["PATH"] = str(tmp_path)  # an empty directory: no chromium, no chromedriver
    if required:
        env["JOBGUARD_REQUIRE_BROWSER"] = "1"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rfEs", "-p", "no:cacheprovider", BROWSER_TEST],
        cwd=REPO_ROOT,
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done.returncode, done.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize("required", [True, False], ids=["required", "optional"])
def test_a_missing_browser_fails_only_where_it_is_required(tmp_path: Path, required: bool) -> None:
    status, summary = run_without_a_browser(tmp_path, required=required)
    if required:  # the browser fixture fails: an error, and the run fails
        assert status == 1, summary
        assert "1 error" in summary, summary
        assert "skipped" not in summary, summary
    else:
        assert status == 0, summary
        assert "1 skipped" in summary, summary
