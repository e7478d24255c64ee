"""A PostgreSQL password never shows: not in ``App.url``, error messages or the CLI's stderr (#18).

libpq takes the password before the ``@`` or as ``?password=``; both are masked as ``***``
wherever jobguard shows the URL, and a driver message that quotes it is masked too. The store
is still opened with the real URL.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from jobguard import App, StoreUnavailableError
from tests.e2e.test_cli import run_process
from tests.support import pg

SECRET = "hunter22-not-shown"
UNREACHABLE = [
    f"postgresql://postgres@127.0.0.1:1/test?password={SECRET}",
    f"postgresql://postgres:{SECRET}@127.0.0.1:1/test",
    f"postgresql://postgres@127.0.0.1:1/test?sslmode=disable&password={SECRET}&schema=jobs",
]


@pytest.mark.parametrize("url", UNREACHABLE)
def test_app_url_and_errors_mask_the_password(url: str) -> None:
    app = App(url)
    assert SECRET not in app.url
    assert "***" in app.url
    with pytest.raises(StoreUnavailableError) as raised:
        app.jobs()
    assert SECRET not in str(raised.value)
    with pytest.raises(StoreUnavailableError) as migrating:
        app.migrate(dry_run=True)
    assert SECRET not in str(migrating.value)


@pytest.mark.parametrize("url", UNREACHABLE)
@pytest.mark.parametrize("command", [["jobs"], ["migrate"], ["dlq", "list"], ["doctor"]])
def test_the_cli_never_prints_the_password(url: str, command: list[str], tmp_path: Path) -> None:
    done = run_process(["--url", url, *command], tmp_path)
    assert done.returncode == 3, done.stderr
    assert SECRET not in done.stderr + done.stdout
    assert "***" in done.stderr


def test_the_store_is_opened_with_the_real_password(tmp_path: Path) -> None:
    """The masked URL is only shown: the App still connects with what it was given (the test
    server trusts local logins, so any password is accepted, but it must reach libpq)."""
    url = f"{pg.fresh_store_url(pg.session_database())}&password={SECRET}"
    app = App(url)
    try:
        assert SECRET not in app.url
        assert app.jobs() == []
    finally:
        app.close()
    done = run_process(["--url", url, "jobs"], tmp_path)
    assert done.returncode == 0, done.stderr
    assert SECRET not in done.stderr + done.stdout
