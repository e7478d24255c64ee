"""A worker or scheduler whose store became unusable under it stops and says why, instead of
polling a file nobody writes to or retrying forever: a SQLite file deleted or replaced, a
PostgreSQL schema dropped."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import textwrap
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import closing, contextmanager
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import psycopg
import pytest
from psycopg import sql

from jobguard import App, Context, JobStatus
from jobguard.backends.base import DeliveryRules, Prepared
from jobguard.backends.sqlite import SQLiteBackend
from jobguard.backends.sqlite.connection import failed
from jobguard.exceptions import StoreBrokenError
from tests.support import stores
from tests.support.procs import clean_env, entry_point, wait_until

TASKS = textwrap.dedent(
    """
    from datetime import datetime, timedelta

    from jobguard import App, Context

    app = App({url!r})


    @app.task
    def noop(ctx: Context) -> None:
        pass


    @app.periodic(every=timedelta(hours=1))
    def hourly(ctx: Context, tick: datetime) -> None:
        pass
    """
)


@contextmanager
def running(
    tmp_path: Path, command: str, url: str = "sqlite:///jobs.db"
) -> Iterator[subprocess.Popen[str]]:
    """`jobguard --app tasks:app COMMAND` on the store at ``url`` (jobs.db in ``tmp_path``),
    killed if left running."""
    (tmp_path / "tasks.py").write_text(TASKS.format(url=url))
    env = clean_env()
    env["PYTHONPATH"] = str(tmp_path)
    proc = subprocess.Popen(
        [*entry_point(), "--app", "tasks:app", command],
        cwd=tmp_path,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()


def remove_store_and_wait(proc: subprocess.Popen[str], tmp_path: Path, how: str) -> None:
    """Delete the store's files (and with ``replaced`` make a new store there); the process must
    then stop with exit 3 and say why in one line."""
    for suffix in ("", "-wal", "-shm"):
        Path(f"{tmp_path / 'jobs.db'}{suffix}").unlink(missing_ok=True)
    if how == "replaced":
        SQLiteBackend(str(tmp_path / "jobs.db")).close()  # a new, empty store at the path
    stopped_saying(proc, "error: store unavailable: the SQLite file", "deleted or replaced while")


def stopped_saying(proc: subprocess.Popen[str], *parts: str) -> None:
    """The process stops with exit 3, its last line of stderr holding each of ``parts``."""
    code = proc.wait(timeout=30)
    assert proc.stderr is not None
    stderr = proc.stderr.read()
    assert code == 3, stderr
    last = stderr.strip().splitlines()[-1]
    assert all(part in last for part in parts), stderr
    assert "Traceback" not in stderr


def hourly_schedule_recorded(tmp_path: Path) -> Callable[[], bool]:
    """Whether the scheduler's first pass has written the schedule's cursor."""

    def recorded() -> bool:
        app = App(f"sqlite:///{tmp_path / 'jobs.db'}")
        try:
            return any(state.name == "tasks.hourly" for state in app.backend.schedule_states())
        finally:
            app.close()

    return recorded


@pytest.mark.parametrize("how", ["deleted", "replaced"])
def test_a_worker_whose_sqlite_file_is_deleted_or_replaced_stops_with_exit_3(
    tmp_path: Path, how: str
) -> None:
    with running(tmp_path, "worker") as proc:
        assert proc.stderr is not None
        assert "on queues" in proc.stderr.readline()
        remove_store_and_wait(proc, tmp_path, how)


@pytest.mark.parametrize("how", ["deleted", "replaced"])
def test_a_scheduler_whose_sqlite_file_is_deleted_or_replaced_stops_with_exit_3(
    tmp_path: Path, how: str
) -> None:
    """Between two ticks a scheduler only reads, which the old file still answers: it must
    notice the file itself, as a worker does."""
    with running(tmp_path, "scheduler") as proc:
        assert proc.stderr is not None
        assert proc.stderr.readline().startswith("scheduler ")
        # The first pass wrote the cursor; the next tick is up to an hour away.
        wait_until(hourly_schedule_recorded(tmp_path))
        remove_store_and_wait(proc, tmp_path, how)


def test_a_read_only_database_is_a_broken_store_not_a_passing_outage() -> None:
    """SQLite's "readonly" errors are what the worker must not retry forever."""
    read_only = sqlite3.OperationalError("attempt to write a readonly database")
    assert isinstance(failed("write", read_only), StoreBrokenError)
    locked = sqlite3.OperationalError("database is locked")
    assert not isinstance(failed("write", locked), StoreBrokenError)


class TurnsReadOnly(SQLiteBackend):
    """A real store whose writes fail as a read-only file's do once ``read_only`` is set."""

    read_only = False

    def fetch_prepared(
        self,
        queues: Sequence[str],
        limit: int,
        worker_id: str,
        rules: Mapping[str, DeliveryRules] | None = None,
    ) -> list[Prepared]:
        if self.read_only:
            raise failed("write", sqlite3.OperationalError("attempt to write a readonly database"))
        return super().fetch_prepared(queues, limit, worker_id, rules)


def test_a_burst_worker_on_a_store_that_turned_read_only_stops_instead_of_looping(
    tmp_path: Path,
) -> None:
    store = TurnsReadOnly(str(tmp_path / "jobs.db"))
    app = App(backend=store)

    @app.task
    def slow(ctx: Context) -> None:
        store.read_only = True  # while this job runs, the file turns read-only

    slow.enqueue()
    slow.enqueue()
    worker = app.worker(concurrency=1, prefetch=0, install_signal_handlers=False, grace_s=1.0)
    runner = threading.Thread(target=worker.run, kwargs={"burst": True}, daemon=True)
    runner.start()
    try:
        wait_until(lambda: not runner.is_alive(), timeout_s=30)
        assert isinstance(worker.failure, StoreBrokenError)
        assert "cannot be written" in str(worker.failure)
    finally:
        worker.stop()
        runner.join(10)
        app.close()
    os.sync()


def drop_jobguard_tables(url: str) -> None:
    """Take jobguard's tables from under the store: drop its PostgreSQL schema, or the SQLite
    file's jobs and schedules tables (the file itself stays)."""
    if stores.kind_of(url) == "postgres":
        schema = parse_qs(urlsplit(url).query)["schema"][0]
        with psycopg.connect(url.split("?", maxsplit=1)[0], autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))
        return
    with closing(sqlite3.connect(url.removeprefix("sqlite:///"))) as conn:
        conn.execute("DROP TABLE jobs")
        conn.execute("DROP TABLE schedules")
        conn.commit()


def drop_tables_and_wait(proc: subprocess.Popen[str], url: str) -> None:
    """Drop jobguard's tables; the process must then stop with exit 3 and say why, not retry
    an outage that never passes."""
    drop_jobguard_tables(url)
    stopped_saying(proc, "error: store unavailable: ", "was dropped or changed while in use")


def test_a_worker_whose_tables_are_dropped_stops_with_exit_3(
    tmp_path: Path, store_url: str
) -> None:
    with running(tmp_path, "worker", store_url) as proc:
        assert proc.stderr is not None
        assert "on queues" in proc.stderr.readline()
        drop_tables_and_wait(proc, store_url)


def test_a_scheduler_whose_tables_are_dropped_stops_with_exit_3(
    tmp_path: Path, store_url: str
) -> None:
    with running(tmp_path, "scheduler", store_url) as proc:
        assert proc.stderr is not None
        assert proc.stderr.readline().startswith("scheduler ")
        app = App(store_url)
        try:
            wait_until(lambda: any(s.name == "tasks.hourly" for s in app.backend.schedule_states()))
        finally:
            app.close()
        drop_tables_and_wait(proc, store_url)


def test_a_missing_table_of_a_steps_own_sql_is_its_error_not_a_broken_store(
    store_url: str,
) -> None:
    """Only jobguard's own statements meeting its dropped tables break the store: a step whose
    SQL names a table that does not exist fails its job with ``StepSQLError`` and the worker
    goes on; once jobguard's tables are dropped, each way it writes or reads says the store is
    broken."""
    app = App(store_url)
    insert = ("INSERT INTO no_such_table VALUES (1)", None)

    @app.task(name="writes_nowhere", operation_key="writes-nowhere", max_attempts=1)
    def writes_nowhere(ctx: Context) -> None:
        ctx.db_writes("insert", [insert])

    @app.task(name="steps_nowhere", operation_key="steps-nowhere", max_attempts=1)
    def steps_nowhere(ctx: Context) -> None:
        ctx.db_step("insert", lambda conn: conn.execute(insert[0]) and None)

    jobs = [writes_nowhere.enqueue(), steps_nowhere.enqueue()]
    try:
        worker = app.worker(install_signal_handlers=False)
        worker.run(burst=True)
        assert worker.failure is None
        assert [app.get_job(job.id).status for job in jobs] == [JobStatus.DEAD] * 2
        assert {a.error_type for a in app.attempts(limit=10)} == {"StepSQLError"}
        drop_jobguard_tables(store_url)
        driver = app.backend.driver
        for use in (
            lambda: driver.write_statement("extend_leases", {"items": []}),
            lambda: driver.write(lambda tx: tx.one("any_ready", {"queues": ["q"], "now": 0.0})),
            lambda: driver.read(lambda tx: tx.one("any_ready", {"queues": ["q"], "now": 0.0})),
        ):
            with pytest.raises(StoreBrokenError, match="was dropped or changed while in use"):
                use()
    finally:
        app.close()
