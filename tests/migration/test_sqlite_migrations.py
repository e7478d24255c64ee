"""Migrations of the SQLite backend: fresh files, reopening, failures and concurrent first opens.

The schema version lives in jobguard's own ``jobguard_schema`` table (``PRAGMA user_version``
belongs to the file's owner); every migration runs in one transaction.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import ExitStack, closing
from pathlib import Path

import pytest

from jobguard.backends._sql import load_migrations
from jobguard.backends.sqlite import SQLiteBackend
from jobguard.backends.sqlite import connection as sqlite_connection
from jobguard.backends.sqlite.connection import (
    SQLiteOptions,
    migrate,
    open_connection,
    schema_version,
    split_statements,
)
from jobguard.exceptions import ConfigurationError, StoreUnavailableError
from jobguard.models import JobSpec, JobStatus

LATEST = load_migrations("jobguard.backends.sqlite")[-1][0]
SHIPPED = [version for version, _name, _sql in load_migrations("jobguard.backends.sqlite")]
TABLES = {"jobs", "attempts", "locks", "operations", "steps", "schedules"}


def inspect_file(path: Path) -> tuple[int, str, dict[str, str]]:
    """``(schema version, journal_mode, {object name: its CREATE statement})`` of a database."""
    with closing(sqlite3.connect(path)) as conn:
        version = schema_version(conn)
        mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
        schema = {
            name: sql
            for name, sql in conn.execute(
                "SELECT name, sql FROM sqlite_master WHERE sql IS NOT NULL ORDER BY name"
            )
        }
    return version, mode, schema


@pytest.fixture
def opened(db_path: Path) -> Iterator[SQLiteBackend]:
    """A backend on a fresh file, closed after the test."""
    backend = SQLiteBackend(str(db_path))
    yield backend
    backend.close()


def spec() -> JobSpec:
    """A minimal job."""
    return JobSpec(
        task="t", queue="default", payload="{}", max_attempts=1, visibility_timeout_s=30.0
    )


def test_a_fresh_file_is_migrated_to_the_latest_version_in_wal_mode(
    opened: SQLiteBackend, db_path: Path
) -> None:
    """Opening a new file creates every table and records the version."""
    version, mode, schema = inspect_file(db_path)
    assert version == LATEST
    assert mode == "wal"
    assert set(schema) >= TABLES


def test_reopening_a_migrated_file_changes_nothing_and_keeps_the_data(
    opened: SQLiteBackend, db_path: Path
) -> None:
    """Migrations are idempotent: a second open (a new worker process) neither re-runs them nor
    loses rows."""
    job = opened.enqueue(spec())
    opened.close()
    before = inspect_file(db_path)
    again = SQLiteBackend(str(db_path))
    try:
        assert inspect_file(db_path) == before
        assert again.get_job(job.id).status == JobStatus.QUEUED
    finally:
        again.close()
    with closing(open_connection(SQLiteOptions(str(db_path)))) as conn:
        assert migrate(conn) == (LATEST, [])
    assert inspect_file(db_path) == before


def test_a_migration_already_recorded_is_never_applied_again(db_path: Path) -> None:
    """``jobguard_schema`` is the record of what ran: a recorded version is skipped."""
    with closing(sqlite3.connect(db_path)) as conn:
        conn.execute(
            "CREATE TABLE jobguard_schema (version INTEGER PRIMARY KEY, name TEXT NOT NULL,"
            " applied_at REAL NOT NULL)"
        )
        conn.executemany(
            "INSERT INTO jobguard_schema VALUES (?, 'recorded', 0)",
            [(v,) for v in range(1, LATEST + 1)],
        )
        conn.commit()
    with closing(open_connection(SQLiteOptions(str(db_path)))) as conn:
        assert migrate(conn) == (LATEST, [])
    _, _, schema = inspect_file(db_path)
    assert not TABLES & set(schema)


def test_the_files_user_version_is_left_to_its_owner(opened: SQLiteBackend, db_path: Path) -> None:
    """A migration tool of the user's that keeps its version in ``PRAGMA user_version`` works on
    the shared file: jobguard neither reads nor writes it after the move below."""
    with closing(sqlite3.connect(db_path)) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 0
        conn.execute("PRAGMA user_version=7")
    opened.close()
    again = SQLiteBackend(str(db_path))
    again.enqueue(spec())
    again.close()
    with closing(sqlite3.connect(db_path)) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 7
    assert inspect_file(db_path)[0] == LATEST


def test_a_file_versioned_in_user_version_moves_to_the_version_table(db_path: Path) -> None:
    """Files made before the version table (schema 1 in ``user_version``) are migrated in place:
    data kept, every version recorded, and ``user_version`` given back to the owner."""
    (first,) = [m for m in load_migrations("jobguard.backends.sqlite") if m[0] == 1]
    with closing(sqlite3.connect(db_path, isolation_level=None)) as conn:
        for statement in split_statements(first[2]):
            conn.execute(statement)
        conn.execute("PRAGMA user_version=1")
        conn.execute(
            "INSERT INTO jobs (task, queue, payload, status, run_at, max_attempts,"
            " visibility_timeout_s, created_at) VALUES ('t', 'default', '{}', 'queued', 0, 1,"
            " 30, 0)"
        )
    backend = SQLiteBackend(str(db_path))
    try:
        assert [job.task for job in backend.find_jobs()] == ["t"]
    finally:
        backend.close()
    with closing(sqlite3.connect(db_path)) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 0
        recorded = [v for (v,) in conn.execute("SELECT version FROM jobguard_schema ORDER BY 1")]
    assert recorded == SHIPPED


def test_a_failing_migration_rolls_back_entirely(
    opened: SQLiteBackend, db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A migration is all or nothing: a broken step leaves the previous version intact."""
    opened.close()
    before = inspect_file(db_path)
    broken = "CREATE TABLE half_done (x INTEGER);\nINSERT INTO no_such_table VALUES (1);\n"
    shipped = load_migrations("jobguard.backends.sqlite")
    monkeypatch.setattr(
        sqlite_connection,
        "migrations_of",
        lambda package: [*shipped, (LATEST + 1, "broken", broken)],
    )
    with pytest.raises(StoreUnavailableError, match="migrate"):
        SQLiteBackend(str(db_path))
    assert inspect_file(db_path) == before


CHILD = textwrap.dedent(
    """
    import sys
    from jobguard.backends.sqlite import SQLiteBackend
    from jobguard.models import JobSpec

    print("READY", flush=True)
    sys.stdin.readline()  # the start gun: every process opens the new file at once
    backend = SQLiteBackend(sys.argv[1])
    job = backend.enqueue(JobSpec(task="t", queue="default", payload="{}",
                                  max_attempts=1, visibility_timeout_s=30.0))
    backend.close()
    print("OK", job.id, flush=True)
    """
)


def _kill_if_running(child: subprocess.Popen[str]) -> None:
    if child.poll() is None:
        child.kill()


@pytest.mark.parametrize("round_no", range(3))
def test_processes_opening_a_new_file_at_once_all_succeed(tmp_path: Path, round_no: int) -> None:
    """Several workers started together on a fresh file: each migrates or sees it migrated;
    none fails with 'database is locked' or a half-made schema."""
    path = tmp_path / f"race-{round_no}.db"
    with ExitStack() as stack:
        children = [
            stack.enter_context(
                subprocess.Popen(
                    [sys.executable, "-c", CHILD, str(path)],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
            for _ in range(4)
        ]
        for child in children:
            stack.callback(_kill_if_running, child)  # runs before each Popen's own cleanup
        for child in children:
            assert child.stdout is not None
            assert child.stdout.readline().strip() == "READY"
        for child in children:
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
        results = [child.communicate(timeout=60) for child in children]
    for child, (out, err) in zip(children, results, strict=True):
        assert child.returncode == 0, err
        assert out.startswith("OK "), (out, err)
    version, mode, schema = inspect_file(path)
    assert (version, mode) == (LATEST, "wal")
    assert set(schema) >= TABLES
    with closing(sqlite3.connect(path)) as conn:
        assert conn.execute("SELECT count(*) FROM jobs").fetchone()[0] == 4


def test_a_database_from_a_newer_jobguard_is_refused_not_downgraded(tmp_path: Path) -> None:
    """Opening a newer schema with older code would corrupt it silently; refuse with advice."""
    path = tmp_path / "newer.db"
    SQLiteBackend(str(path)).close()
    with closing(sqlite3.connect(path)) as conn:
        conn.execute("INSERT INTO jobguard_schema VALUES (999, 'from the future', 0)")
        conn.commit()
    with pytest.raises(ConfigurationError, match="newer"):
        SQLiteBackend(str(path))
