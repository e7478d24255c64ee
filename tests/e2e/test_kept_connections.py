"""A worker's long-lived threads keep one pooled PostgreSQL connection between their store calls
instead of taking one from the shared pool for each (``keep_connection``): counted by the pool,
against a real server."""

from __future__ import annotations

import multiprocessing
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from jobguard import App, Context, StoreUnavailableError, busy
from jobguard.backends.postgres import PostgresBackend
from jobguard.backends.postgres import kept as kept_module
from jobguard.backends.postgres.driver import PostgresDriver
from jobguard.testing import drain
from tests.support import pg, stores


@pytest.fixture
def url() -> str:
    """A migrated schema of its own, with a ``notes`` table beside jobguard's."""
    address = pg.fresh_store_url(pg.session_database())
    stores.execute(address, [f'CREATE TABLE "{stores.schema_of(address)}".notes (n integer)'])
    return address


@pytest.fixture
def driver(url: str) -> Iterator[PostgresDriver]:
    backend = PostgresBackend(url)
    yield backend.driver
    backend.close()


def requests(driver: PostgresDriver) -> int:
    """How many connections the pool has handed out so far."""
    return int(driver._pool_of_this_process().get_stats().get("requests_num", 0))


def session(driver: PostgresDriver) -> int:
    """The server process of the connection a read runs on."""
    return int(driver.read(lambda tx: tx.connection.info.backend_pid))


def notes(driver: PostgresDriver, schema: str) -> int:
    return int(
        driver.read(
            lambda tx: tx.connection.execute(f'SELECT count(*) FROM "{schema}".notes')
        ).fetchone()[0]
    )


def test_a_thread_keeping_its_connection_takes_one_from_the_pool_for_all_its_calls(
    driver: PostgresDriver,
) -> None:
    before = requests(driver)
    with driver.keep_connection():
        sessions = {session(driver) for _ in range(10)}
        assert driver._kept.kept == 1
    assert len(sessions) == 1
    assert requests(driver) - before == 1
    assert driver._kept.kept == 0

    before = requests(driver)
    for _ in range(10):
        session(driver)
    assert requests(driver) - before == 10


def test_a_call_while_the_kept_connection_is_in_a_transaction_takes_another(
    driver: PostgresDriver, url: str
) -> None:
    """A store call from inside a write's transaction (a step that enqueues) does not join it:
    it runs on another connection and sees only what is committed."""
    schema = stores.schema_of(url)
    seen: dict[str, int] = {}

    def write(tx: Any) -> None:
        tx.connection.execute(f'INSERT INTO "{schema}".notes VALUES (1)')
        seen["inner session"] = session(driver)
        seen["inner count"] = notes(driver, schema)
        seen["outer session"] = int(tx.connection.info.backend_pid)

    with driver.keep_connection():
        kept = session(driver)
        driver.write(write)
        assert seen == {
            "inner session": seen["inner session"],
            "inner count": 0,
            "outer session": kept,
        }
        assert seen["inner session"] != kept
        assert notes(driver, schema) == 1
        assert session(driver) == kept


def test_a_call_that_fails_gives_its_connection_back_and_the_next_one_works(
    driver: PostgresDriver,
) -> None:
    with driver.keep_connection():
        session(driver)
        before = requests(driver)
        with pytest.raises(StoreUnavailableError, match="division by zero"):
            driver.read(lambda tx: tx.connection.execute("SELECT 1 / 0"))
        assert driver._kept.kept == 0
        session(driver)
        session(driver)
        assert requests(driver) - before == 1
        assert driver._kept.kept == 1


def test_a_call_that_leaves_a_transaction_open_gives_its_connection_back(
    driver: PostgresDriver,
) -> None:
    with driver.keep_connection():
        driver.read(lambda tx: tx.connection.execute("BEGIN"))
        assert driver._kept.kept == 0
        status = driver.read(lambda tx: tx.connection.info.transaction_status)
        assert status.name == "IDLE"


def test_a_kept_connection_goes_back_to_the_pool_once_kept_long_enough(
    driver: PostgresDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kept_module, "KEPT_FOR_S", 0.0)
    before = requests(driver)
    with driver.keep_connection():
        for _ in range(3):
            session(driver)
            assert driver._kept.kept == 0
    assert requests(driver) - before == 3


def test_no_more_connections_are_kept_than_leave_two_of_the_pool_for_the_rest(url: str) -> None:
    """With a pool of 3, one thread keeps a connection while it waits; another thread that
    keeps one too would leave none for a third: it takes one of the pool's for each call."""
    backend = PostgresBackend(url, pool_size=3)
    driver = backend.driver
    holding, release = threading.Event(), threading.Event()

    def idle_keeper() -> None:
        with driver.keep_connection():
            session(driver)
            holding.set()
            release.wait(10)

    keeper = threading.Thread(target=idle_keeper)
    keeper.start()
    try:
        assert holding.wait(10)
        before = requests(driver)
        with driver.keep_connection():
            for _ in range(5):
                session(driver)
                assert driver._kept.kept == 1
        others = [
            threading.Thread(target=lambda: [session(driver) for _ in range(5)]) for _ in range(2)
        ]
        for other in others:
            other.start()
        for other in others:
            other.join(10)
        assert not any(other.is_alive() for other in others)
        assert requests(driver) - before == 15
    finally:
        release.set()
        keeper.join(10)
        backend.close()
    assert driver._kept.kept == 0


def _child_session(url: str, results: Any) -> None:
    """In a forked child: the parent's backend, read inside keep_connection."""
    driver = _inherited[0]
    with driver.keep_connection():
        results.put((session(driver), session(driver), driver._kept.kept))


_inherited: list[PostgresDriver] = []


def test_a_forked_child_never_uses_the_connection_its_parent_keeps(
    driver: PostgresDriver, url: str
) -> None:
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    _inherited[:] = [driver]
    try:
        with driver.keep_connection():
            kept = session(driver)
            child = context.Process(target=_child_session, args=(url, results))
            child.start()
            first, second, child_kept = results.get(timeout=30)
            child.join(30)
            assert child.exitcode == 0
            assert first == second != kept
            assert child_kept == 1
            assert session(driver) == kept  # the parent's own connection, undisturbed
            assert driver._kept.kept == 1
    finally:
        _inherited.clear()


def test_a_busy_workers_threads_keep_their_connections(url: str) -> None:
    """Without kept connections every fetch, step and settle takes one from the pool (more
    than one a job); with them, about one for each of the worker's threads for the run."""
    app = App(url)
    schema = stores.schema_of(url)
    try:

        @app.task(name="note", operation_key="note:{n}", resource_key="page:{n}")
        def note(ctx: Context, n: int) -> None:
            ctx.db_writes("write", [(f'INSERT INTO "{schema}".notes VALUES (%s)', (n,))])

        note.enqueue_many({"n": n} for n in range(200))
        driver = app.backend.driver
        before = requests(driver)
        drain(app, concurrency=4)
        assert notes(driver, schema) == 200
        # 8 seen: the four handlers, the fetch loop and the settler, and a few calls of other
        # threads; 31 when the settler took one for each batch it settled.
        assert requests(driver) - before < 20
    finally:
        app.close()


def test_an_idle_workers_threads_give_their_connections_back(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Handlers and the settler give their connections back once no work came for
    ``KEEP_IDLE_S`` (the fetch loop, polling, keeps its one); all of them when the worker
    stops."""
    monkeypatch.setattr(busy, "KEEP_IDLE_S", 0.2)
    app = App(url)
    schema = stores.schema_of(url)
    try:

        @app.task(name="note", operation_key="note:{n}")
        def note(ctx: Context, n: int) -> None:
            ctx.db_writes("write", [(f'INSERT INTO "{schema}".notes VALUES (%s)', (n,))])

        driver = app.backend.driver
        worker = app.worker(concurrency=4, install_signal_handlers=False, grace_s=1.0)
        running = threading.Thread(target=worker.run)
        running.start()
        try:
            note.enqueue_many({"n": n} for n in range(200))
            busiest = until(lambda: notes(driver, schema) == 200, lambda: driver._kept.kept)
            assert max(busiest) >= 3
            idle = until(lambda: driver._kept.kept <= 1, lambda: driver._kept.kept)
            assert idle[-1] <= 1
        finally:
            worker.stop()
            running.join(30)
        assert not running.is_alive()
        assert driver._kept.kept == 0
    finally:
        app.close()


def until(done: Callable[[], bool], sample: Callable[[], int], timeout_s: float = 20) -> list[int]:
    """Poll ``done`` until it holds, sampling ``sample`` meanwhile; the samples."""
    samples = [sample()]
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, f"not done in {timeout_s}s: {samples[-5:]}"
        time.sleep(0.01)
        samples.append(sample())
    samples.append(sample())
    return samples
