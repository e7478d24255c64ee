"""A worker or scheduler restarted on a read-only store: one line, exit 3 (#18).

On SQLite the file is made read-only for real: ``chmod 444``, and, since root writes through
that, the immutable attribute (``chattr +i``) when the tests run as root. On PostgreSQL, a
database of its own with ``default_transaction_read_only`` on, or a role that may only read
jobguard's tables (the shared test database's settings are left alone). The restarted process
must say so in one ``error:`` line naming the cause before it announces itself, instead of
starting and failing every fetch.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from tests.e2e.test_cli import run_process
from tests.support import pg

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


COMMANDS = [["worker", "--burst"], ["worker"], ["scheduler"]]


def write_app(tmp_path: Path, url: str) -> str:
    """The app module on ``url`` in ``tmp_path``; its ``--app`` name."""
    module = f"ro_{uuid.uuid4().hex[:10]}"
    (tmp_path / f"{module}.py").write_text(APP_SOURCE.format(url=url))
    return f"{module}:app"


def assert_one_line(done: subprocess.CompletedProcess[str], cause: str) -> None:
    """Exit 3, and one ``error:`` line naming ``cause``."""
    assert done.returncode == 3, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("error: store unavailable: ")
    assert cause in lines[0]


@contextmanager
def own_database() -> Iterator[str]:
    """A store URL in a database of its own, dropped afterwards."""
    database = pg.create_database()
    try:
        yield pg.fresh_store_url(database)
    finally:
        pg.drop_database(database)


def make_read_only(url: str) -> None:
    """From now on, every new session of ``url``'s database is read-only."""
    name = url.split("?", 1)[0].rsplit("/", 1)[1]
    with psycopg.connect(pg.ADMIN_URL, autocommit=True) as conn:
        statement = "ALTER DATABASE {} SET default_transaction_read_only = on"
        conn.execute(sql.SQL(statement).format(sql.Identifier(name)))


@contextmanager
def reading_role(url: str) -> Iterator[str]:
    """``url`` as a role of its own that may read jobguard's tables, not write them."""
    role = f"jobguard_reader_{uuid.uuid4().hex[:8]}"
    schema = url.split("schema=", 1)[1]
    database_url = url.split("?", 1)[0]
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
        conn.execute(
            sql.SQL(
                "GRANT USAGE ON SCHEMA {s} TO {r}; GRANT SELECT ON ALL TABLES IN SCHEMA {s} TO {r}"
            ).format(s=sql.Identifier(schema), r=sql.Identifier(role))
        )
    try:
        yield url.replace("postgres@", f"{role}@", 1)
    finally:
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


@pytest.mark.parametrize("command", COMMANDS)
def test_a_process_restarted_on_a_read_only_postgres_database_exits_3_with_one_line(
    tmp_path: Path, command: list[str]
) -> None:
    with own_database() as url:
        app = write_app(tmp_path, url)
        first = run_process(["--app", app, "enqueue", "t"], tmp_path)
        assert first.returncode == 0, first.stderr
        make_read_only(url)
        done = run_process(["--app", app, *command], tmp_path, timeout_s=30)
    assert_one_line(done, "default_transaction_read_only is on")


@pytest.mark.parametrize("command", COMMANDS)
def test_a_process_restarted_as_a_role_that_cannot_write_exits_3_with_one_line(
    tmp_path: Path, command: list[str]
) -> None:
    url = pg.fresh_store_url(pg.session_database())
    first = run_process(["--app", write_app(tmp_path, url), "enqueue", "t"], tmp_path)
    assert first.returncode == 0, first.stderr
    with reading_role(url) as reader_url:
        app = write_app(tmp_path, reader_url)
        done = run_process(["--app", app, *command], tmp_path, timeout_s=30)
    assert_one_line(done, "may not insert into or update these tables")
    assert "jobs" in done.stderr


@pytest.mark.parametrize("command", COMMANDS)
def test_a_process_restarted_on_a_read_only_file_exits_3_with_one_line(
    tmp_path: Path, command: list[str]
) -> None:
    db = tmp_path / "jobs.db"
    app = write_app(tmp_path, f"sqlite:///{db}")
    first = run_process(["--app", app, "enqueue", "t"], tmp_path)
    assert first.returncode == 0, first.stderr
    with read_only(db):
        done = run_process(["--app", app, *command], tmp_path, timeout_s=30)
    assert_one_line(done, "read-only")
