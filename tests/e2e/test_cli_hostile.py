"""The operator's terminal is safe, and bad input never gets a traceback (G14).

Stored text comes from handlers and producers: an escape sequence in an error message or a key
must be shown escaped by every command that prints it. Bad input (deep ``--kwargs``, numbers
out of range, a payload planted as a BLOB) gets one ``error:`` line and a documented exit code.
"""

from __future__ import annotations

import sqlite3
import sys
import uuid
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from jobguard import App, JobStatus
from jobguard.cli.main import EXIT_USAGE, cli
from jobguard.testing import drain
from tests.support import stores

HOSTILE = "\x1b]0;pwned\x07\x1b[2J\x1b[31mred\r\x9b"
APP_SOURCE = """
from jobguard import App, Context

app = App({url!r})


@app.task(name="explode", max_attempts=2, backoff_base_s=0, operation_key="op:{{tag}}")
def explode(ctx: Context, tag: str) -> None:
    raise ValueError({hostile!r} + tag)
"""


@pytest.fixture
def module(store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """An app module in ``tmp_path`` whose handler raises an error full of escape sequences."""
    name = f"cli_hostile_{uuid.uuid4().hex[:12]}"
    (tmp_path / f"{name}.py").write_text(APP_SOURCE.format(url=store_url, hostile=HOSTILE))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    imported = sys.modules.pop(name, None)
    if imported is not None:
        imported.app.close()


def run(*args: str) -> Result:
    """Invoke the CLI in-process with separate stdout and stderr."""
    return CliRunner().invoke(cli, list(args), prog_name="jobguard")


def test_control_characters_in_stored_text_are_shown_escaped_by_every_command(
    module: str,
) -> None:
    """An error message and an operation key holding OSC/CSI sequences, BEL, CR and a C1
    control: ``jobs``, ``dlq list``, ``dlq show``, ``attempts`` and ``doctor`` print them as
    ``\\x1b``-style escapes, never raw."""
    app_path = f"{module}:app"
    enqueued = run("--app", app_path, "enqueue", "explode", "--kwargs", '{"tag": "\\u001b[5m"}')
    assert enqueued.exit_code == 0, enqueued.output
    app: App = sys.modules[module].app
    drain(app)
    [job] = app.dlq.list()
    assert job.status == JobStatus.DEAD
    commands = [
        ["jobs"],
        ["dlq", "list"],
        ["dlq", "show", str(job.id)],
        ["attempts", "--job", str(job.id)],
        ["attempts", "--operation", "op:\x1b[5m"],
        ["doctor"],
    ]
    for command in commands:
        result = run("--app", app_path, *command)
        assert result.exit_code == 0, (command, result.output)
        shown = result.stdout
        for raw in ("\x1b", "\x07", "\r", "\x9b"):
            assert raw not in shown, (command, shown)
        assert "\\x1b" in shown, (command, shown)


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)  # only SQLite stores a BLOB
def test_a_payload_planted_as_a_blob_is_shown_by_dlq_show_not_a_traceback(
    module: str, store_url: str
) -> None:
    """A dead job whose payload row is a BLOB of invalid UTF-8: ``dlq show`` prints it raw
    (escaped) with what is wrong with it, and ``--json`` output carries it escaped; exit 0."""
    result = run("--app", f"{module}:app", "enqueue", "explode", "--kwargs", '{"tag": "x"}')
    assert result.exit_code == 0, result.output
    app: App = sys.modules[module].app
    drain(app)
    [job] = app.dlq.list()
    with closing(sqlite3.connect(stores.sqlite_file(store_url))) as conn, conn:
        conn.execute("UPDATE jobs SET payload = ? WHERE id = ?", (b"\xff\x1b[2J", job.id))
    shown = run("--app", f"{module}:app", "dlq", "show", str(job.id))
    assert shown.exit_code == 0, shown.output
    assert "payload is not valid JSON" in shown.stdout
    assert "\x1b" not in shown.stdout
    for command in (["dlq", "show", str(job.id), "--json"], ["jobs", "--json"]):
        as_json = run("--app", f"{module}:app", *command)
        assert as_json.exit_code == 0, as_json.output
        assert "\\u001b[2J" in as_json.stdout


DEEP_KWARGS = '{"tag": ' + "[" * 100_000 + "]" * 100_000 + "}"
TOO_DEEP_KWARGS = '{"tag": ' + "[" * 100 + "]" * 100 + "}"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["enqueue", "explode", "--kwargs", DEEP_KWARGS], "--kwargs"),
        (["enqueue", "explode", "--kwargs", TOO_DEEP_KWARGS], "nest deeper than 64 levels"),
        (["enqueue", "explode", "--kwargs", '{"tag": "a"}', "--priority", str(2**70)], "priority"),
        (["enqueue", "explode", "--kwargs", '{"tag": "a"}', "--delay-s", "nan"], "delay_s"),
        (["enqueue", "explode", "--kwargs", '{"tag": "a"}', "--delay-s", "inf"], "delay-s"),
        (["attempts", "--job", str(2**70)], "--job"),
        (["dlq", "show", str(2**70)], "ID"),
        (["jobs", "--limit", str(2**70)], "--limit"),
        (["doctor", "--since-s", "inf"], "--since-s"),
        (["worker", "--burst", "--grace-s", "nan"], "grace_s"),
    ],
    ids=lambda v: v[-2] if isinstance(v, list) else None,
)
def test_bad_input_gets_one_error_line_and_the_usage_exit_code(
    module: str, args: list[str], message: str
) -> None:
    """Deep ``--kwargs`` and numbers out of range: exit 2 and one ``error:`` line naming the
    option, never a traceback (docs/cli.md, exit codes)."""
    result = run("--app", f"{module}:app", *args)
    assert result.exit_code == EXIT_USAGE, (result.output, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    assert message in lines[0]
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    ("source", "app", "message"),
    [
        ("import os\nKEY = os.environ['MAIL_API_KEY_NOT_SET']\n", "{m}:app", "raised KeyError"),
        ("raise RuntimeError('settings missing')\n", "{m}:app", "settings missing"),
        ("", ".{m}:app", "not an absolute module name"),
        ("", "../{m}:app", "not an absolute module name"),
        ("", "{m}.py:app", "cannot import"),
    ],
    ids=["missing-env", "raises", "relative", "path", "file-name"],
)
def test_an_app_module_that_cannot_be_imported_exits_2_with_one_line(
    tmp_path: Path, source: str, app: str, message: str
) -> None:
    """A real ``jobguard`` process: an ``--app`` whose module raises at import, or a relative
    name or a path, exits 2 with one ``error:`` line, not 4 "a bug in jobguard"."""
    from tests.e2e.test_cli import run_process

    module = f"careless_{uuid.uuid4().hex[:10]}"
    (tmp_path / f"{module}.py").write_text(source)
    done = run_process(["--app", app.format(m=module), "jobs"], tmp_path)
    assert done.returncode == EXIT_USAGE, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("error: ")
    assert message in lines[0]
    assert "bug in jobguard" not in lines[0]


def test_migrate_dry_run_on_sqlite_creates_nothing_and_changes_nothing(tmp_path: Path) -> None:
    """``jobguard migrate --dry-run`` (a real process) prints the SQL a missing file would get
    without creating it, and leaves an existing file's bytes and journal mode as they were."""
    from tests.e2e.test_cli import run_process

    missing = tmp_path / "missing.db"
    dry = run_process(["--url", f"sqlite:///{missing}", "migrate", "--dry-run"], tmp_path)
    assert dry.returncode == 0, dry.stderr
    assert "CREATE TABLE IF NOT EXISTS jobs" in dry.stdout
    assert "would apply" in dry.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []

    theirs = tmp_path / "theirs.db"
    with closing(sqlite3.connect(theirs)) as conn, conn:
        conn.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY)")
    before = theirs.read_bytes()
    dry = run_process(["--url", f"sqlite:///{theirs}", "migrate", "--dry-run"], tmp_path)
    assert dry.returncode == 0, dry.stderr
    assert "CREATE TABLE IF NOT EXISTS jobs" in dry.stdout
    assert theirs.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["theirs.db"]
    with closing(sqlite3.connect(theirs)) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("delete",)

    current = tmp_path / "current.db"
    App(f"sqlite:///{current}").counts()  # a store at this version
    before = current.read_bytes()
    dry = run_process(["--url", f"sqlite:///{current}", "migrate", "--dry-run"], tmp_path)
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout == ""
    assert "nothing to apply" in dry.stderr
    assert current.read_bytes() == before
