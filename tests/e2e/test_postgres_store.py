"""PostgreSQL as the store: migrations, and bad URLs or schemas refused with a clear error that
changes nothing."""

from __future__ import annotations

import logging
import subprocess
import threading
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from jobguard import App, ConfigurationError, Context, Outcome, StoreUnavailableError
from jobguard.backends import migrate_store
from jobguard.backends._sql import load_migrations
from jobguard.backends.postgres import PostgresBackend
from jobguard.backends.postgres import driver as postgres_driver
from jobguard.backends.postgres.clock import ServerClock
from jobguard.exceptions import SchemaVersionError
from jobguard.testing import drain
from tests.support import pg, stores
from tests.support.procs import clean_env, entry_point


def fresh_schema_url() -> str:
    """A schema name nobody has used, not migrated."""
    import secrets

    return f"{pg.session_database()}?schema=fresh_{secrets.token_hex(4)}"


def schemas() -> set[str]:
    rows = stores.query(pg.session_database(), "SELECT nspname FROM pg_namespace")
    return {row[0] for row in rows}


def jobguard(*args: str) -> subprocess.CompletedProcess[str]:
    command = [*entry_point(), *args]
    return subprocess.run(
        command, check=False, capture_output=True, text=True, env=clean_env(), timeout=60
    )


def test_migrate_dry_run_shows_the_sql_and_changes_nothing_then_migrate_applies_it() -> None:
    url = fresh_schema_url()
    schema = stores.schema_of(url)
    dry = jobguard("--url", url, "migrate", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "CREATE TABLE jobs" in dry.stdout
    assert schema not in schemas()

    done = jobguard("--url", url, "migrate")
    assert done.returncode == 0, done.stderr
    latest = load_migrations("jobguard.backends.postgres")[-1][0]
    assert f"migrated to schema version {latest}" in done.stdout
    again = jobguard("--url", url, "migrate")
    assert f"already at schema version {latest}" in again.stdout
    app = App(url)
    try:
        assert app.counts()  # the store opens and answers
    finally:
        app.close()


def test_a_store_that_was_never_migrated_is_refused_saying_what_to_run() -> None:
    url = fresh_schema_url()
    with pytest.raises(SchemaVersionError, match="jobguard migrate"):
        PostgresBackend(url)
    done = jobguard("--url", url, "jobs")
    assert done.returncode == 2
    assert "jobguard migrate" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_schema_newer_than_this_jobguard_is_refused() -> None:
    url = fresh_schema_url()
    migrate_store(url)
    schema = stores.schema_of(url)
    with psycopg.connect(pg.session_database(), autocommit=True) as conn:
        conn.execute(f"INSERT INTO \"{schema}\".jobguard_schema (version, name) VALUES (99, 'x')")
    with pytest.raises(SchemaVersionError, match="newer than this jobguard knows"):
        PostgresBackend(url)
    with pytest.raises(SchemaVersionError, match="newer"):
        migrate_store(url)


@pytest.mark.parametrize(
    "schema", ["Jobs", "job-guard", "1jobs", 'x"; DROP TABLE y; --', "a" * 64, ""]
)
def test_a_schema_name_that_is_not_a_plain_identifier_is_refused(schema: str) -> None:
    url = f"{pg.session_database()}?schema={schema}"
    before = schemas()
    with pytest.raises(ConfigurationError, match="schema name"):
        App(url)
    with pytest.raises(ConfigurationError, match="schema name"):
        PostgresBackend(pg.session_database(), schema=schema)
    assert schemas() == before


def _replace(url: str, **parts: str) -> str:
    return urlunsplit(urlsplit(url)._replace(**parts))


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"netloc": "postgres@127.0.0.1:1"}, "cannot connect"),  # nothing listens there
        ({"netloc": "no_such_role@127.0.0.1:5432"}, "no_such_role"),
        ({"path": "/no_such_database"}, "no_such_database"),
        ({"netloc": "postgres:secret-pw@127.0.0.1:1"}, "***"),  # the password is never shown
    ],
)
def test_a_url_that_cannot_reach_the_database_gets_a_clear_error(
    change: dict[str, str], says: str
) -> None:
    url = _replace(pg.session_database(), **change)
    with pytest.raises(StoreUnavailableError, match="cannot connect") as caught:
        PostgresBackend(url)
    assert says in str(caught.value)
    assert "secret-pw" not in str(caught.value)
    done = jobguard("--url", url, "migrate")
    assert done.returncode == 3
    assert done.stderr.startswith("error:")
    assert "secret-pw" not in done.stderr


def test_the_fetch_settle_and_db_writes_are_prepared_at_their_first_run_and_a_callers_are_not() -> (
    None
):
    """jobguard prepares its hot statements (the fetch, a db_writes step's record with its
    proofs, the settle) the first time they run on a connection of its own, so that a new connection
    of the pool does not parse and plan them anew for their first runs; the caller's statement
    inside the step, run once, is not prepared."""
    url = fresh_schema_url()
    migrate_store(url)
    # One connection in the pool: every statement of the delivery runs on it.
    app = App(backend=PostgresBackend(url, pool_size=1))
    notes = f'"{stores.schema_of(url)}".notes'
    stores.execute(url, [f"CREATE TABLE {notes} (n integer PRIMARY KEY)"])
    try:

        @app.task(name="note", operation_key="note:{n}", resource_key="page:{n}")
        def note(ctx: Context, n: int) -> None:
            ctx.db_writes("write", [(f"INSERT INTO {notes} (n) VALUES (%s)", (n,))])

        note.enqueue(n=1)
        drain(app)
        assert stores.query(url, f"SELECT n FROM {notes}") == [(1,)]

        pool = app.backend.driver._pool_of_this_process()
        with pool.connection() as conn:
            prepared = [
                row[0] for row in conn.execute("SELECT statement FROM pg_prepared_statements")
            ]
        for opening in (
            "-- A fetch's pick and lease",
            "-- A db_writes step's record",
            "-- How deliveries end",
        ):
            assert any(text.lstrip().startswith(opening) for text in prepared), opening
        assert not any(notes in text for text in prepared)
    finally:
        app.close()


def test_a_pooled_connection_keeps_its_cursors_from_one_statement_to_the_next(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A cursor made anew looks up again how to send each value of a statement; the pool's
    connections keep theirs (one for jobguard's statements, one for a step's), so a worker of
    one handler makes a few cursors for a run of jobs, not several per job. A step refused by
    the server leaves the kept cursors as usable as new ones: the next job's step runs."""
    url = fresh_schema_url()
    migrate_store(url)
    app = App(backend=PostgresBackend(url, pool_size=2))
    notes = f'"{stores.schema_of(url)}".notes'
    stores.execute(url, [f"CREATE TABLE {notes} (n integer PRIMARY KEY CHECK (n <> 7))"])
    made: list[object] = []
    make = psycopg.Cursor.__init__

    def counted(cursor: psycopg.Cursor[object], *args: object, **kwargs: object) -> None:
        made.append(cursor)
        make(cursor, *args, **kwargs)  # type: ignore[arg-type]

    try:

        @app.task(name="note", operation_key="note:{n}", max_attempts=1)
        def note(ctx: Context, n: int) -> None:
            ctx.db_writes("write", [(f"INSERT INTO {notes} (n) VALUES (%s)", (n,))])

        jobs = [note.enqueue(n=n) for n in range(20)]
        monkeypatch.setattr(psycopg.Cursor, "__init__", counted)
        drain(app)
        monkeypatch.undo()
        assert [n for (n,) in stores.query(url, f"SELECT n FROM {notes} ORDER BY n")] == [
            n for n in range(20) if n != 7
        ]
        statuses = {job.id: app.get_job(job.id).status.value for job in jobs}
        assert [status for status in statuses.values() if status != "completed"] == ["dead"]
        # 20 jobs, each with a fetch share, a step of two statements and a settle share: a
        # cursor each would be 60 or more.
        assert len(made) <= 10, len(made)
    finally:
        app.close()


def test_a_worker_of_more_handler_threads_than_the_default_pool_has_a_connection_for_each() -> None:
    """The default pool holds 10 connections; a worker of 16 handler threads, all inside a
    db_step at once (each holding a connection until all 16 are in), gets a connection for
    every one of them: the pool grows to the worker's handlers and its own loops, so no
    handler waits for another to finish."""
    url = fresh_schema_url()
    migrate_store(url)
    app = App(url)
    handlers = 16
    together = threading.Barrier(handlers, timeout=20.0)
    try:

        @app.task(name="hold", operation_key="hold:{n}", max_attempts=1)
        def hold(ctx: Context, n: int) -> None:
            ctx.db_step("all-in", lambda conn: together.wait() * 0)

        jobs = [hold.enqueue(n=n) for n in range(handlers)]
        drain(app, concurrency=handlers, timeout_s=90)
        outcomes = [[a.outcome for a in app.attempts(job_id=job.id)] for job in jobs]
        assert outcomes == [[Outcome.COMPLETED]] * handlers
    finally:
        app.close()


def test_a_pool_size_given_below_a_workers_handlers_is_kept_and_said(
    caplog: pytest.LogCaptureFixture,
) -> None:
    url = fresh_schema_url()
    migrate_store(url)
    backend = PostgresBackend(url, pool_size=4)
    try:
        with caplog.at_level(logging.WARNING, logger="jobguard.store"):
            backend.expect_handlers(8)
        assert [record.getMessage() for record in caplog.records] == [
            "pool_size=4 is below the 12 connections a worker of 8 handler threads may use at "
            "once: handlers will wait for connections"
        ]
    finally:
        backend.close()


class StoppedHostClock:
    """A host clock that moves only when a test moves it."""

    def __init__(self) -> None:
        self.t = 1000.0

    def now(self) -> float:
        return self.t


def test_a_job_due_now_is_ready_for_a_fetch_after_its_commit_whatever_each_process_carries(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each process carries its own reading of the server's clock, off by up to half that
    reading's round trip. A job due now is stamped by the server and judged ready on the
    server's clock, so the fetch that follows its enqueue's wake-up takes it even when the
    producer's reading runs ahead and the worker's behind; a job due later still waits until
    an operator makes it due now, and a replayed dead job is due at once too."""
    hosts: list[StoppedHostClock] = []

    def server_clock_on_a_stopped_host() -> ServerClock:
        hosts.append(StoppedHostClock())
        return ServerClock(hosts[-1].now)

    monkeypatch.setattr(postgres_driver, "ServerClock", server_clock_on_a_stopped_host)
    url = fresh_schema_url()
    migrate_store(url)
    producer = App(backend=PostgresBackend(url))
    worker = PostgresBackend(url)
    try:

        @producer.task(name="plain", operation_key="plain:{n}", resource_key="plain:{n}")
        def plain(ctx: Context, n: int) -> None:
            """Not run: the test fetches by hand."""

        @producer.task(
            name="limited", operation_key="limited:{n}", concurrency_key="one", concurrency_limit=1
        )
        def limited(ctx: Context, n: int) -> None:
            """Not run: a concurrency slot takes the fetch's longer way."""

        @producer.task(name="broken", operation_key="broken:{n}", max_attempts=1)
        def broken(ctx: Context, n: int) -> None:
            raise RuntimeError("buried at its first attempt")

        rules = {name: t.delivery_rules() for name, t in producer.tasks.items()}

        def fetched(queue: str) -> list[int]:
            return [item.delivery.job_id for item in worker.fetch_prepared([queue], 10, "w", rules)]

        dead = broken.enqueue(n=1)
        drain(producer)  # buried
        for host in hosts:
            host.t += 2.0  # past the last reading's second: the next use reads the server again
        # Each reads the server's clock, then carries it.
        producer.backend.now()
        worker.now()
        # The producer's reading now runs 0.9 s ahead of the server's; the worker's host clock
        # stays where it was read, so its reading falls behind the server's as time passes.
        hosts[0].t += 0.9
        waiting = plain.options(delay_s=30).enqueue(n=0)
        for task in (plain, limited):
            job = task.enqueue(n=1)
            assert fetched(job.queue) == [job.id], task.name
        # An operator's "due now" is the server's too: a retry-now, and a dead job's replay.
        producer.retry_now(waiting.id, actor="test")
        assert fetched(waiting.queue) == [waiting.id]
        producer.dlq.replay(dead.id)
        assert fetched(dead.queue) == [dead.id]
    finally:
        worker.close()
        producer.close()
