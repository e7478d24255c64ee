"""jobguard's own line breaks show as lines on the terminal; hostile control characters from
stored data stay escaped (guarantee G14, :mod:`jobguard.core.text`).

A table cell of several lines (a schedule's next fire times), a stored multi-line error, a
multi-line connection error and a traceback's heading: each shows its lines, with no ``\\x0a``,
while an escape sequence or a carriage return in the same stored text is written as an escape.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from jobguard import App, Context
from jobguard.cli.main import cli
from jobguard.testing import drain

APP_SOURCE = """
from jobguard import App

app = App({url!r})


@app.periodic(every=60, name="tidy")
def tidy(ctx, tick):
    pass
"""

HOSTILE = "first line\nsecond line \x1b]0;owned\x07 \x1b[2J\rthird"


def run(*args: str) -> Result:
    """The CLI in-process, wide enough that no cell folds an escape sequence in two."""
    return CliRunner().invoke(cli, list(args), prog_name="jobguard", env={"COLUMNS": "1000"})


@pytest.fixture
def module(store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """An app module with one schedule on the test's store, importable by ``--app``."""
    name = f"lines_{uuid.uuid4().hex[:12]}"
    (tmp_path / f"{name}.py").write_text(APP_SOURCE.format(url=store_url))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield f"{name}:app"
    imported = sys.modules.pop(name, None)
    if imported is not None:
        imported.app.close()


def test_a_schedules_next_fire_times_are_lines_of_their_cell(module: str) -> None:
    shown = run("--app", module, "schedules", "--next", "3")
    assert shown.exit_code == 0, shown.output
    assert "\\x0a" not in shown.stdout
    assert sum(":00+00:00" in line for line in shown.stdout.splitlines()) == 3


def test_a_stored_multi_line_error_shows_its_lines_and_escapes_the_rest(store_url: str) -> None:
    app = App(store_url)

    @app.task(name="fails", max_attempts=1)
    def fails(ctx: Context) -> None:
        raise ValueError(HOSTILE)

    job = fails.enqueue()
    drain(app)
    app.close()

    listed = run("--url", store_url, "jobs")
    assert listed.exit_code == 0, listed.output
    assert "\\x0a" not in listed.stdout
    for args in (["attempts", "--job", str(job.id)], ["dlq", "show", str(job.id)]):
        shown = run("--url", store_url, *args)
        assert shown.exit_code == 0, shown.output
        assert "\\x0a" not in shown.stdout, args
        assert not {"\x1b", "\x07", "\r"} & set(shown.stdout), args
        assert "\\x1b]0;owned\\x07" in shown.stdout, args
        assert "\\x1b[2J\\x0dthird" in shown.stdout, args
        lines = [line.strip(" │|") for line in shown.stdout.splitlines()]
        assert any(line.startswith("second line") for line in lines), args


def test_a_multi_line_connection_error_shows_its_lines() -> None:
    shown = run("--url", "postgresql://postgres@127.0.0.1:1/test", "jobs")
    assert shown.exit_code == 3
    assert shown.stderr.startswith("error: store unavailable")
    assert "\\x0a" not in shown.stderr
    assert "\\x09" not in shown.stderr
