"""PostgreSQL: two workers never take the same rows in opposite orders (no deadlock to break).

On PostgreSQL workers write in parallel under row locks; a fetch's begin and another worker's
finish, or two fetches, that took lock rows and operation rows in opposite orders would wait for
each other until the server broke the deadlock (after ``deadlock_timeout``) and threw one
transaction's work away. Each test pauses one worker's transaction right after a statement (an
injected fault point), starts the other worker, and asserts the server counted no deadlock.
SQLite serialises writers with one file lock, so the question does not arise there.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest

from jobguard.backends.base import Closing, Ending, Prepared
from jobguard.backends.postgres import PostgresBackend
from jobguard.backends.sql.driver import Tx
from jobguard.models import Guard, Outcome
from tests.support import pg
from tests.support.ports import keyed_spec, rules_for, success


class _PausingTx:
    """A transaction that waits for ``go`` right after the statement named ``after``."""

    def __init__(self, tx: Tx, after: str, paused: threading.Event, go: threading.Event) -> None:
        self._tx, self._after, self._paused, self._go = tx, after, paused, go

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tx, name)

    def _maybe_pause(self, name: str) -> None:
        if name == self._after:
            self._paused.set()
            self._go.wait(20)

    def run(self, name: str, params: Any) -> int:
        changed = self._tx.run(name, params)
        self._maybe_pause(name)
        return changed

    def one(self, name: str, params: Any) -> Any:
        row = self._tx.one(name, params)
        self._maybe_pause(name)
        return row

    def all(self, name: str, params: Any) -> Any:
        found = self._tx.all(name, params)
        self._maybe_pause(name)
        return found


@contextmanager
def paused_after(
    store: PostgresBackend, statement: str
) -> Iterator[tuple[threading.Event, threading.Event]]:
    """Pause ``store``'s transactions after ``statement`` until ``go`` is set."""
    paused, go = threading.Event(), threading.Event()
    make_tx = store.driver._tx
    store.driver._tx = lambda conn, **options: _PausingTx(  # type: ignore[method-assign]
        make_tx(conn, **options), statement, paused, go
    )
    try:
        yield paused, go
    finally:
        go.set()
        store.driver._tx = make_tx  # type: ignore[method-assign]


def _deadlocks(url: str) -> int:
    database = url.split("?", maxsplit=1)[0].rsplit("/", 1)[1]
    with psycopg.connect(pg.ADMIN_URL, autocommit=True) as conn:
        row = conn.execute(
            "SELECT deadlocks FROM pg_stat_database WHERE datname = %s", (database,)
        ).fetchone()
    assert row is not None
    return int(row[0])


def _race(first: Any, first_store: PostgresBackend, statement: str, second: Any) -> dict[str, Any]:
    """Run ``first`` until it pauses after ``statement``, start ``second``, let both finish."""
    results: dict[str, Any] = {}
    one = threading.Thread(target=lambda: results.setdefault("first", first()))
    two = threading.Thread(target=lambda: results.setdefault("second", second()))
    with paused_after(first_store, statement) as (paused, go):
        one.start()
        assert paused.wait(10)  # the first worker sits inside its transaction now
        two.start()
        two.join(0.5)  # the second worker now waits for a row the first holds, or is done
        go.set()
        one.join(20)
        two.join(20)
    assert not one.is_alive()
    assert not two.is_alive()
    return results


@pytest.fixture
def url() -> str:
    return pg.fresh_store_url(pg.session_database())


@dataclass
class _Workers:
    """Worker 1 holds lock ``dock:1`` and claim ``op:1`` with a success to settle for each
    (``acks``); worker 2 has a job waiting for each of them."""

    finishing: PostgresBackend
    fetching: PostgresBackend
    acks: list[Ending]

    def settle(self) -> list[Any]:
        return self.finishing.settle(self.acks)

    def settle_in_a_transaction(self) -> list[Any]:
        """The acks with a stale delivery's refusal, which only a transaction writes (its
        attempt row is marked too): ``settle_set`` then holds its rows until the commit."""
        stale = Ending(Guard(0, "stale", 0), Closing(0.1), Outcome.LEASE_REFUSED, reason="stale")
        return self.finishing.settle([*self.acks, stale])

    def fetch(self) -> list[Prepared]:
        return self.fetching.fetch_prepared(["b"], 10, "w2", rules_for("tests.keyed"))


@pytest.fixture
def two_workers(url: str) -> Iterator[_Workers]:
    finishing, fetching = PostgresBackend(url), PostgresBackend(url)
    try:
        finishing.enqueue_many([keyed_spec("a", "dock:1", None), keyed_spec("a", None, "op:1")])
        held = finishing.fetch_prepared(["a"], 10, "w1", rules_for("tests.keyed"))
        fetching.enqueue_many([keyed_spec("b", "dock:1", None), keyed_spec("b", None, "op:1")])
        yield _Workers(finishing, fetching, [_ack(item) for item in held])
    finally:
        finishing.close()
        fetching.close()


def test_a_fetch_beginning_and_a_finish_take_lock_rows_before_operation_rows(
    url: str, two_workers: _Workers
) -> None:
    before = _deadlocks(url)
    results = _race(
        two_workers.settle_in_a_transaction,
        two_workers.finishing,
        "settle_set",  # the finish's one statement: every row it writes is taken by then
        two_workers.fetch,
    )
    assert _deadlocks(url) == before
    assert results["first"] == [None, None, None]
    begun = {
        p.delivery.resource_key or p.delivery.operation_key: p.begun for p in results["second"]
    }
    assert begun["dock:1"] is not None
    assert begun["dock:1"].grant is not None
    assert begun["op:1"] is not None
    assert begun["op:1"].operation is not None


def test_a_finish_waiting_for_a_lock_row_a_begin_holds_has_not_taken_its_operation_row(
    url: str, two_workers: _Workers
) -> None:
    """The other way round: a fetch's begin holds the lock row (its grant looked at it) when a
    finish of the lock's and the operation's holders starts; the finish must wait there, before
    the operation row, which the begin takes next."""
    before = _deadlocks(url)
    results = _race(two_workers.fetch, two_workers.fetching, "begin_batch", two_workers.settle)
    assert _deadlocks(url) == before
    assert results["second"] == [None, None]
    assert len(results["first"]) == 2


def _ack(item: Prepared) -> Ending:
    assert item.begun is not None
    guard = Guard(
        item.delivery.job_id, item.delivery.lease_token, item.delivery.attempt_id, item.begun.grant
    )
    return success(guard, Closing(0.1), Outcome.COMPLETED, item.delivery.operation_key, "1")


def test_set_and_one_by_one_begins_lock_resources_in_the_same_order_whatever_the_collation() -> (
    None
):
    """A database whose collation sorts "a" before "B" (ICU en-US) while Python sorts by code
    point ("B" first): a batch begun as a set and one begun one by one still agree."""
    name = "jobguard_test_icu_order"
    with psycopg.connect(pg.ADMIN_URL, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        conn.execute(
            f"CREATE DATABASE {name} LOCALE_PROVIDER icu ICU_LOCALE 'en-US' "
            "LOCALE 'C.UTF-8' TEMPLATE template0"
        )
    url = pg.fresh_store_url(pg.with_database(pg.ADMIN_URL, name))
    as_set, one_by_one = PostgresBackend(url), PostgresBackend(url)
    try:
        as_set.enqueue_many([keyed_spec("a", "a", None), keyed_spec("a", "B", None)])
        # Two deliveries asking for "a": this batch begins one by one, in code-point order.
        one_by_one.enqueue_many(
            [keyed_spec("b", "B", None), keyed_spec("b", "a", None), keyed_spec("b", "a", None)]
        )
        before = _deadlocks(url)
        _race(
            lambda: one_by_one.fetch_prepared(["b"], 10, "w2", rules_for("tests.keyed")),
            one_by_one,
            "grant_locks",
            lambda: as_set.fetch_prepared(["a"], 10, "w1", rules_for("tests.keyed")),
        )
        assert _deadlocks(url) == before
    finally:
        as_set.close()
        one_by_one.close()
        with psycopg.connect(pg.ADMIN_URL, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
