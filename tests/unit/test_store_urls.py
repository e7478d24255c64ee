"""Store URLs are checked where they are written: ``App(url)``, before any file or connection."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobguard import App, ConfigurationError


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("", "empty"),
        ("   ", "empty"),
        ("sqlite:///:memory:", "in-memory"),
        ("sqlite:///file::memory:?cache=shared", "in-memory"),
        ("sqlite://relative.db", "sqlite:///path"),
        ("mysql://localhost/jobs", "unsupported store URL scheme 'mysql'"),
        ("redis://localhost:6379/0", "unsupported store URL scheme 'redis'"),
        ("jobs.db", "unsupported store URL scheme ''"),
        ("postgresql://localhost:notaport/jobs", "malformed"),
        ("postgresql://localhost/jobs?schema=Bad-Name", "schema name"),
    ],
)
def test_a_url_jobguard_cannot_use_is_refused_when_the_app_is_made(
    url: str, says: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigurationError, match=says):
        App(url)
    assert list(tmp_path.iterdir()) == []  # nothing was created


def test_no_url_means_the_default_file_and_is_not_opened_until_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    app = App()
    assert app.url == "sqlite:///jobguard.db"
    assert list(tmp_path.iterdir()) == []
