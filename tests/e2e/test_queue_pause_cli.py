"""``jobguard queue pause|resume|list`` through the real executable, on both stores (#17)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.support.procs import REPO_ROOT, clean_env, entry_point
from tests.support.queue_app import make_app


def cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*entry_point(), "--url", url, "queue", *args],
        cwd=REPO_ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_pause_list_resume_through_the_cli(store_url: str) -> None:
    paused = cli(store_url, "pause", "emails")
    assert paused.returncode == 0, paused.stderr
    assert "queue emails paused" in paused.stdout
    listed = cli(store_url, "list")
    assert listed.returncode == 0, listed.stderr
    assert "emails" in listed.stdout
    assert "paused" in listed.stdout
    jobs = subprocess.run(
        [*entry_point(), "--url", store_url, "jobs"],
        cwd=REPO_ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert jobs.returncode == 0, jobs.stderr
    assert "paused queues (no job of theirs starts): emails" in jobs.stdout
    again = cli(store_url, "pause", "emails")
    assert (again.returncode, "already paused" in again.stdout) == (0, True)
    app = make_app(store_url)
    try:
        (state,) = app.paused_queues()
        assert state.queue == "emails"
        assert state.paused_by.startswith("cli:")
        resumed = cli(store_url, "resume", "emails")
        assert resumed.returncode == 0, resumed.stderr
        assert "queue emails resumed" in resumed.stdout
        assert app.paused_queues() == []
        assert [e.action for e in app.audit_trail()] == ["resume queue", "pause queue"]
        not_paused = cli(store_url, "resume", "emails")
        assert (not_paused.returncode, "was not paused" in not_paused.stdout) == (0, True)
    finally:
        app.close()


@pytest.mark.parametrize("verb", ["pause", "resume"])
@pytest.mark.parametrize("name", ["a b", "<x>", "x" * 65, "-x"])
def test_a_queue_name_that_is_not_valid_exits_2_and_changes_nothing(
    tmp_path: Path, verb: str, name: str
) -> None:
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    result = cli(url, verb, "--", name)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "is not a plain identifier" in result.stderr
    assert "Traceback" not in result.stderr
    app = make_app(url)
    try:
        assert app.paused_queues() == []
        assert app.audit_trail() == []
    finally:
        app.close()
