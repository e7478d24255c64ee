"""Group commit: many threads, one transaction, every caller told the truth about its write."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

from jobguard.backends.sqlite.connection import GroupCommitter, SQLiteOptions, open_connection
from jobguard.exceptions import StoreUnavailableError


@pytest.fixture
def committer(tmp_path: Path) -> GroupCommitter:
    options = SQLiteOptions(str(tmp_path / "g.db"))
    conn = open_connection(options)
    conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v INTEGER NOT NULL UNIQUE)")
    conn.close()
    return GroupCommitter(options)


def count(committer: GroupCommitter) -> int:
    return int(committer.run(lambda c: c.execute("SELECT count(*) FROM t").fetchone()[0]))


def test_concurrent_writers_each_get_their_own_result_and_all_rows_commit(
    committer: GroupCommitter,
) -> None:
    """8 threads x 50 inserts through one committer: each caller gets its own row id back."""
    results: dict[int, int] = {}
    lock = threading.Lock()

    def writer(base: int) -> None:
        for n in range(base, base + 50):
            row_id = committer.run(
                lambda c, n=n: c.execute("INSERT INTO t (v) VALUES (?)", (n,)).lastrowid
            )
            with lock:
                results[n] = row_id

    threads = [threading.Thread(target=writer, args=(i * 100,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 400
    stored = dict(committer.run(lambda c: c.execute("SELECT v, id FROM t").fetchall()))
    assert stored == results


def test_a_failing_write_is_undone_alone_and_its_caller_gets_the_error(
    committer: GroupCommitter,
) -> None:
    """A refused write in a shared transaction rolls back to its savepoint only (a driver error
    reaches the caller wrapped as a jobguard error)."""
    committer.run(lambda c: c.execute("INSERT INTO t (v) VALUES (1)"))
    with pytest.raises(StoreUnavailableError, match="UNIQUE"):
        committer.run(
            lambda c: (
                c.execute("INSERT INTO t (v) VALUES (2)"),
                c.execute("INSERT INTO t (v) VALUES (1)"),
            )
        )
    committer.run(lambda c: c.execute("INSERT INTO t (v) VALUES (3)"))
    rows = committer.run(lambda c: [r[0] for r in c.execute("SELECT v FROM t ORDER BY v")])
    assert rows == [1, 3]


def test_a_broken_transaction_fails_every_caller_and_the_next_write_still_works(
    committer: GroupCommitter,
) -> None:
    """If the savepoint machinery itself fails, nothing was durable: say so, and recover."""

    def breaks_its_savepoint(conn: sqlite3.Connection) -> None:
        conn.execute("INSERT INTO t (v) VALUES (10)")
        conn.execute("RELEASE request")  # the committer's own RELEASE then fails

    with pytest.raises(StoreUnavailableError):
        committer.run(breaks_its_savepoint)
    assert count(committer) == 0  # the insert did not survive
    committer.run(lambda c: c.execute("INSERT INTO t (v) VALUES (11)"))
    assert count(committer) == 1
