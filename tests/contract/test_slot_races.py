"""PostgreSQL: workers granting slots of one key at the same moment never exceed its limit.

Workers begin in parallel on PostgreSQL: a fetch that looked at a key's slots before another
fetch's grant of them committed must not be granted those slots too, and neither may wait for
the other in a deadlock. One fetch is paused inside its transaction right after its grant (an
injected fault point, as in ``test_row_lock_order``); the other runs meanwhile.
"""

from __future__ import annotations

import pytest

from jobguard.backends.base import DeliveryRules
from jobguard.backends.postgres import PostgresBackend
from jobguard.models import BusyReason, JobSpec
from tests.contract.test_row_lock_order import _deadlocks, _race
from tests.support import pg

RULES = {"tests.slotted": DeliveryRules(None, 5, 30.0)}


@pytest.fixture
def url() -> str:
    return pg.fresh_store_url(pg.session_database())


def slotted(queue: str) -> JobSpec:
    return JobSpec(
        task="tests.slotted",
        queue=queue,
        payload="{}",
        max_attempts=5,
        visibility_timeout_s=60.0,
        concurrency_key="acct:1",
        concurrency_limit=3,
        lock_ttl_s=30.0,
    )


def test_two_fetches_granting_one_keys_slots_at_once_grant_at_most_its_limit(url: str) -> None:
    first, second = PostgresBackend(url), PostgresBackend(url)
    try:
        first.enqueue_many([slotted("a"), slotted("a")])
        second.enqueue_many([slotted("b"), slotted("b")])
        before = _deadlocks(url)
        results = _race(
            lambda: first.fetch_prepared(["a"], 10, "w1", RULES),
            first,
            "grant_slots",  # slots 0 and 1 granted, not yet committed
            lambda: second.fetch_prepared(["b"], 10, "w2", RULES),
        )
        assert _deadlocks(url) == before
        begun = [item.begun for item in results["first"] + results["second"]]
        granted = [b.slot for b in begun if b is not None and b.slot is not None]
        assert len(granted) <= 3
        assert len({grant.slot for grant in granted}) == len(granted)  # each slot once
        assert {grant.slot for grant in granted} >= {0, 1}
        busy = [b.busy for b in begun if b is not None and b.slot is None]
        assert busy == [BusyReason.SLOT] * (4 - len(granted))
        live = [grant for grant in first.slot_grants("acct:1") if grant.owner]
        assert sorted(grant.slot or 0 for grant in live) == sorted(g.slot or 0 for g in granted)
    finally:
        first.close()
        second.close()
