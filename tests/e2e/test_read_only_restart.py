"""A worker or scheduler restarted on a read-only SQLite file: one line, exit 3 (#18).

The file is made read-only for real: ``chmod 444``, and, since root writes through that, the
immutable attribute (``chattr +i``) when the tests run as root. The restarted process must say
so in one ``error:`` line before it announces itself, instead of starting, failing its first
fetch, and printing four lines.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.e2e.test_cli import run_process

APP_SOURCE = """
from jobguard import App

app = App({url!r})


@app.task(name="t")
def t(ctx):
    pass


@app.periodic(every=60, name="beat")
def beat(ctx, tick):
    pass
"""


@contextmanager
def read_only(path: Path) -> Iterator[None]:
    """``path`` cannot be written by this process, root included, inside the block."""
    path.chmod(0o444)
    immutable = os.geteuid() == 0
    if immutable:
        subprocess.run(["chattr", "+i", str(path)], check=True)
    try:
        yield
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(path)], check=True)
        path.chmod(0o644)


@pytest.mark.parametrize("command", [["worker", "--burst"], ["worker"], ["scheduler"]])
def test_a_process_restarted_on_a_read_only_file_exits_3_with_one_line(
    tmp_path: Path, command: list[str]
) -> None:
    db = tmp_path / "jobs.db"
    module = f"ro_{uuid.uuid4().hex[:10]}"
    (tmp_path / f"{module}.py").write_text(APP_SOURCE.format(url=f"sqlite:///{db}"))
    first = run_process(["--app", f"{module}:app", "enqueue", "t"], tmp_path)
    assert first.returncode == 0, first.stderr
    with read_only(db):
        done = run_process(["--app", f"{module}:app", *command], tmp_path, timeout_s=30)
    assert done.returncode == 3, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("error: store unavailable: ")
    assert "read-only" in lines[0]
