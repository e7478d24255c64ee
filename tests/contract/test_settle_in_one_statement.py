"""PostgreSQL: a batch of endings with no refusal among them is written by one statement of its
own, outside a transaction, and a claim taken while that statement runs writes none of it.

``settle_set`` proves each item's claim as it moves the job, then completes the operation; a
delivery that takes the claim over in between (its transaction commits while the statement
waits for the operation row) leaves the proof true and the completion undone. In a transaction
the store sees the count fall short and rolls back; on its own the statement must fail by
itself, and does, so the job is not completed without its operation.
"""

from __future__ import annotations

import threading
import time
from typing import Any
from urllib.parse import parse_qs, urlsplit

import psycopg
import pytest
from psycopg import sql

from jobguard.backends.base import Closing
from jobguard.backends.postgres import PostgresBackend
from jobguard.exceptions import LeaseLostError
from jobguard.models import JobStatus, OperationStatus
from tests.support import pg
from tests.support.ports import begin_operation, fetch_one, guard_of, keyed_spec, success


@pytest.fixture
def url() -> str:
    return pg.fresh_store_url(pg.session_database())


def _waiting_for_a_row_lock(conn: psycopg.Connection[Any]) -> bool:
    """Whether some other session of this database waits for a row lock right now."""
    row = conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND pid <> pg_backend_pid() AND wait_event_type = 'Lock'"
    ).fetchone()
    return row is not None and row[0] > 0


def test_a_claim_taken_while_the_one_statement_settles_writes_nothing_of_the_batch(
    url: str,
) -> None:
    backend = PostgresBackend(url)
    database, schema = url.split("?", 1)[0], parse_qs(urlsplit(url).query)["schema"][0]
    try:
        backend.enqueue(keyed_spec("a", None, "op:1"))
        backend.enqueue(keyed_spec("a", None, None))
        keyed, plain = fetch_one(backend, ["a"]), fetch_one(backend, ["a"])
        assert begin_operation(backend, guard_of(keyed), "op:1", None) is not None
        endings = [
            success(guard_of(keyed), Closing(0.1), operation_key="op:1", result_json="1"),
            success(guard_of(plain), Closing(0.1)),
        ]
        results: list[Any] = []
        with psycopg.connect(database) as thief, psycopg.connect(database) as watch:
            watch.autocommit = True
            thief.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
            # Another delivery's claim, not yet committed: the settle waits for this row.
            thief.execute("UPDATE operations SET owner_lease = 'thief' WHERE key = 'op:1'")
            settling = threading.Thread(target=lambda: results.extend(backend.settle(endings)))
            settling.start()
            deadline = time.monotonic() + 10
            while not _waiting_for_a_row_lock(watch):
                assert time.monotonic() < deadline, "the settle never waited for the row"
                time.sleep(0.01)
            thief.commit()
            settling.join(20)
        assert not settling.is_alive()
        assert isinstance(results[0], LeaseLostError)
        assert "no longer claimed" in str(results[0])
        assert results[1] is None  # the other ending of the batch is written, on its own
        assert backend.get_job(keyed.job_id).status is JobStatus.RUNNING
        operation = backend.get_operation("op:1")
        assert operation is not None
        assert operation.status is OperationStatus.PROCESSING
        assert backend.get_job(plain.job_id).status is JobStatus.COMPLETED
        (attempt,) = backend.attempts(job_id=keyed.job_id)
        assert attempt.outcome.value == "running"
    finally:
        backend.close()
