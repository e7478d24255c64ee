"""A network that stops answering must not let two workers act (#18).

Real worker processes reach the real PostgreSQL through :class:`~tests.support.faultproxy.
FaultProxy`, which the tests start themselves and switch between passing, latency, resets and
a black hole (packets dropped, nothing refused).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from urllib.parse import parse_qs, urlsplit

import pytest

from jobguard import App, JobStatus, Outcome
from jobguard.backends.base import BeginRequest, Closing, Ending, Renewal
from jobguard.backends.postgres import PostgresBackend
from jobguard.backends.postgres.driver import render_queries
from jobguard.exceptions import LeaseLostError
from jobguard.pipeline import guard_of
from tests.support import pg, stores
from tests.support.faultproxy import FaultProxy
from tests.support.network_app import (
    BRIEF,
    CALL_ONCE,
    LEASE_S,
    RUN_ONCE,
    make_app,
    read_events,
)
from tests.support.procs import spawn_worker, wait_until, workers

pytestmark = pytest.mark.chaos

APP_MODULE = "tests.support.network_app"
WORK_S = 8.0  # longer than two leases: the job outlives the lease its worker cannot renew


@pytest.fixture
def pg_url() -> str:
    """A fresh jobguard schema on the real PostgreSQL."""
    return pg.fresh_store_url(pg.session_database())


@pytest.fixture
def proxy() -> Iterator[FaultProxy]:
    """A fault proxy in front of the real PostgreSQL."""
    started = FaultProxy()
    yield started
    started.close()


@pytest.fixture
def napp(pg_url: str) -> Iterator[App]:
    """The producer side of ``network_app``, connected directly."""
    application = make_app(pg_url)
    _ = application.backend
    yield application
    application.close()


def events(url: str, what: str) -> list[dict[str, object]]:
    """The handlers' events of one kind."""
    return [event for event in read_events(url) if event["what"] == what]


def test_a_black_hole_tells_the_handler_its_lease_is_lost_in_time_and_the_call_is_made_once(
    pg_url: str, proxy: FaultProxy, napp: App
) -> None:
    """Worker A reaches PostgreSQL through the proxy, worker B directly. Once A renewed its
    lease, a black hole opens under A while its handler works: A's renewals hang (they never
    fail), B takes the job over once the lease ran out. On A's own monotonic clock, A's handler
    sees ``ctx.lease_lost`` within a lease length plus one heartbeat interval of the last
    renewal that succeeded, and its last check that found the lease held came before B's
    handler started: the two never act at once, and the external call is made once, by B."""
    first = spawn_worker(proxy.url_for(pg_url), APP_MODULE, worker_id="A")
    with workers(first) as (worker_a,):
        worker_a.wait_ready()
        job = napp.tasks[CALL_ONCE].enqueue(work_s=WORK_S)
        wait_until(lambda: bool(events(pg_url, "start")), timeout_s=30)
        a_pid = events(pg_url, "start")[0]["pid"]
        wait_until(lambda: any(e["pid"] == a_pid for e in events(pg_url, "renewed")), 30)
        proxy.black_hole()
        with workers(spawn_worker(pg_url, APP_MODULE, worker_id="B")) as (worker_b,):
            worker_b.wait_ready()
            wait_until(lambda: bool(events(pg_url, "external-call")), timeout_s=60)
            wait_until(lambda: bool(events(pg_url, "noticed-lost")), timeout_s=30)
            proxy.heal()
            wait_until(lambda: napp.get_job(job.id).status is JobStatus.COMPLETED, timeout_s=30)
    calls = events(pg_url, "external-call")
    assert [call["worker"] for call in calls] == ["B"]
    (noticed,) = events(pg_url, "noticed-lost")
    assert noticed["worker"] == "A"
    renewed = [e["m"] for e in events(pg_url, "renewed") if e["pid"] == a_pid]
    last_renewed = max(m for m in renewed if m < noticed["m"])
    assert noticed["m"] - last_renewed <= LEASE_S + LEASE_S / 3  # a lease and one beat
    b_start = next(e for e in events(pg_url, "start") if e["worker"] == "B")
    assert noticed["held_m"] < b_start["m"]


def test_every_connection_of_the_store_has_timeouts_and_keepalives(pg_url: str) -> None:
    """A dead network is noticed in seconds: keepalives, a TCP user timeout and a connect
    timeout on every connection, and server-side timeouts on jobguard's own statements; a
    setting the URL gives wins."""
    from jobguard.backends.postgres.driver import PostgresDriver

    driver = PostgresDriver(pg_url + "&connect_timeout=3&options=-c%20lock_timeout%3D7s")
    try:
        with driver.connect() as conn:
            params = conn.info.get_parameters()
            assert params["keepalives"] == "1"
            assert int(params["keepalives_idle"]) <= 5
            assert int(params["tcp_user_timeout"]) <= 10000
            assert params["connect_timeout"] == "3"
            assert conn.execute("SHOW statement_timeout").fetchone() == ("1min",)
            assert conn.execute("SHOW lock_timeout").fetchone() == ("7s",)
        timeouts = driver.read(
            lambda tx: tx.connection.execute("SHOW statement_timeout").fetchone()
        )
        assert timeouts == ("1min",)
    finally:
        driver.close()


def test_an_ack_on_a_connection_reset_meanwhile_is_written_on_a_new_connection(
    pg_url: str, proxy: FaultProxy, napp: App
) -> None:
    """Every connection of the worker is reset while its handler runs (the idle pooled ones
    too), so the ack's transaction fails as it begins: the ack is written again at once on a
    new connection, and the job is not left to its lease to run again."""
    with workers(spawn_worker(proxy.url_for(pg_url), APP_MODULE, worker_id="A")) as (worker,):
        worker.wait_ready()
        job = napp.tasks[RUN_ONCE].enqueue()
        wait_until(lambda: bool(events(pg_url, "ran")), timeout_s=30)
        proxy.reset_all()
        (stores.home_of(pg_url) / "go").touch()
        wait_until(lambda: napp.get_job(job.id).status is JobStatus.COMPLETED, timeout_s=60)
    assert proxy.resets >= 1
    assert [a.outcome for a in napp.attempts(job_id=job.id)] == [Outcome.COMPLETED]
    assert len(events(pg_url, "ran")) == 1


def _ack_cut(pg_url: str, proxy: FaultProxy, napp: App, cut: Callable[[bytes], None]) -> int:
    """A job whose ack meets ``cut``, a fault of the proxy given a line of the settle's one
    statement (past its comment: "moved AS ("); returns the job's id once it completed and a
    later job was settled after it (the worker settles in order, so by then whatever the cut
    led to is written too)."""
    schema = parse_qs(urlsplit(pg_url).query)["schema"][0]
    settle = render_queries(schema)["settle_set"]
    marker = settle[settle.index("moved AS (") :].split("\n")[0].encode()
    with workers(spawn_worker(proxy.url_for(pg_url), APP_MODULE, worker_id="A")) as (worker,):
        worker.wait_ready()
        job = napp.tasks[RUN_ONCE].enqueue()
        wait_until(lambda: bool(events(pg_url, "ran")), timeout_s=30)
        cut(marker)
        (stores.home_of(pg_url) / "go").touch()
        wait_until(lambda: napp.get_job(job.id).status is JobStatus.COMPLETED, timeout_s=60)
        later = napp.tasks[RUN_ONCE].enqueue()
        wait_until(lambda: napp.get_job(later.id).status is JobStatus.COMPLETED, timeout_s=60)
    return job.id


def test_an_ack_whose_connection_is_reset_as_it_is_sent_is_written_on_a_new_one(
    pg_url: str, proxy: FaultProxy, napp: App
) -> None:
    """The connection carrying the ack is reset as the ack's statement is sent (nothing of it
    reached the server): the ack is written again at once, so the job completes on its one
    attempt instead of waiting out its 30 s lease to run again."""
    job_id = _ack_cut(pg_url, proxy, napp, proxy.reset_on)
    assert proxy.reset_marker is None  # the ack's statement was cut
    assert [a.outcome for a in napp.attempts(job_id=job_id)] == [Outcome.COMPLETED]
    assert len(events(pg_url, "ran")) == 2


def test_an_ack_that_landed_but_whose_reply_was_lost_is_known_as_written(
    pg_url: str, proxy: FaultProxy, napp: App
) -> None:
    """The settle's one statement reaches the server and commits, and the connection is cut
    as the server answers: the worker cannot know it landed. It writes the batch again, finds
    its own ending already written (its attempt row closed as completed) and reports it so:
    the job completed on its one attempt, and that attempt row is not marked refused."""
    job_id = _ack_cut(pg_url, proxy, napp, proxy.reset_reply_to)
    assert proxy.replies_cut == 1
    assert [a.outcome for a in napp.attempts(job_id=job_id)] == [Outcome.COMPLETED]
    assert len(events(pg_url, "ran")) == 2


def test_under_latency_a_3s_lease_holds_from_fetch_to_ending(
    pg_url: str, proxy: FaultProxy, napp: App
) -> None:
    """200 ms added each way between a worker and PostgreSQL, leases of 3 s: the time from the
    store starting a lease to its first renewal fits in it (the fetch's round trips after the
    lease began, then a renewal of one round trip, due at once for a delivery just fetched), so
    no handler finds its lease lost, at its start or at its end, and every job completes on its
    first attempt."""
    proxy.latency(0.2)
    jobs = [napp.tasks[BRIEF].enqueue(n=n, work_s=0.5) for n in range(4)]
    url = proxy.url_for(pg_url)
    with workers(spawn_worker(url, APP_MODULE, worker_id="A", concurrency=2)) as (worker,):
        worker.wait_ready()
        wait_until(
            lambda: all(napp.get_job(j.id).status is JobStatus.COMPLETED for j in jobs),
            timeout_s=120,
        )
    assert events(pg_url, "lost-at-start") == []
    assert events(pg_url, "lost") == []
    assert len(events(pg_url, "started")) == len(jobs)
    assert len(events(pg_url, "ran")) == len(jobs)
    outcomes = [a.outcome for j in jobs for a in napp.attempts(job_id=j.id)]
    assert outcomes == [Outcome.COMPLETED] * len(jobs)


def test_a_renewal_is_one_round_trip_and_counts_from_the_lease_start(
    pg_url: str, proxy: FaultProxy, napp: App
) -> None:
    """What keeps a short lease alive on a slow network: renewing every lease in flight is one
    statement and one round trip (no BEGIN, clock reading nor COMMIT around it), the first
    time too, when the statement is prepared on its connection (its messages sent together,
    in a pipeline: the server is ready once), and later in one message; and a fetched delivery
    says when, on this process's clock, the store began its lease (before the fetch
    returned)."""
    napp.tasks[BRIEF].enqueue(n=1, work_s=0.0)
    napp.tasks[BRIEF].enqueue(n=2, work_s=0.0)
    # One connection: the second renewal runs where the first prepared its statement.
    backend = PostgresBackend(proxy.url_for(pg_url), pool_size=1)
    try:
        asked_at = time.monotonic()
        fetched = backend.fetch_prepared(["default"], 2, "w", None)
        returned_at = time.monotonic()
        assert len(fetched) == 2
        for prepared in fetched:
            assert prepared.granted_at is not None
            assert asked_at <= prepared.granted_at <= returned_at
        renewals = [Renewal(guard_of(p.delivery), LEASE_S, None) for p in fetched]
        proxy.server_readies = 0
        results = backend.renew(renewals)
        assert [(r.lease_ok, r.lock_ok) for r in results] == [(True, True)] * 2
        assert proxy.server_readies == 1
        proxy.client_sends = proxy.server_readies = 0
        results = backend.renew(renewals)
        assert [(r.lease_ok, r.lock_ok) for r in results] == [(True, True)] * 2
        assert (proxy.client_sends, proxy.server_readies) == (1, 1)
    finally:
        backend.close()


def test_a_batch_of_successes_settles_in_one_round_trip(
    pg_url: str, proxy: FaultProxy, napp: App
) -> None:
    """Endings with no refusal among them are one statement outside a transaction: no BEGIN,
    clock reading nor COMMIT around it (the clock was just read by the fetch)."""
    for n in (1, 2):
        napp.tasks[BRIEF].enqueue(n=n, work_s=0.0)
    worker_app = make_app(proxy.url_for(pg_url))
    try:
        backend = worker_app.backend
        fetched = backend.fetch_prepared(["default"], 2, "w", None)
        assert len(fetched) == 2
        endings = [Ending(guard_of(p.delivery), Closing(0.01)) for p in fetched]
        proxy.server_readies = 0
        assert backend.settle(endings) == [None, None]
        assert proxy.server_readies == 1
    finally:
        worker_app.close()
    assert {napp.get_job(p.delivery.job_id).status for p in fetched} == {JobStatus.COMPLETED}


def test_db_writes_send_the_whole_step_transaction_in_one_round_trip(
    pg_url: str, proxy: FaultProxy, napp: App
) -> None:
    """``db_writes`` sends the step record with the guard's proofs and then the statements at
    once, in the pipeline's one transaction: the server answers once (a ``db_step`` of the same
    one statement waits for it three times: BEGIN with the proofs, the statement, the step
    record with COMMIT)."""
    wrote = stores.table(pg_url, "wrote")
    stores.execute(pg_url, [f"CREATE TABLE {wrote} (n INTEGER PRIMARY KEY)"])
    insert = f"INSERT INTO {wrote} (n) VALUES (%s)"
    job = napp.tasks[BRIEF].enqueue(n=1, work_s=0.0)
    worker_app = make_app(proxy.url_for(pg_url))
    try:
        backend = worker_app.backend
        (prepared,) = backend.fetch_prepared(["default"], 1, "w", None)
        guard = guard_of(prepared.delivery)
        assert backend.begin(guard, BeginRequest(operation_key="rt:1")).busy is None
        proxy.server_readies = 0
        assert backend.db_writes(guard, "rt:1", "first", [(insert, (1,)), (insert, (2,))])
        assert proxy.server_readies == 1
        proxy.server_readies = 0
        step = backend.db_step(
            guard, "rt:1", "second", lambda conn: conn.execute(insert, (3,)) and 0, ()
        )
        assert step == (True, 0)
        assert proxy.server_readies == 3
    finally:
        worker_app.close()
    assert stores.query(pg_url, f"SELECT n FROM {wrote} ORDER BY n") == [(1,), (2,), (3,)]
    assert prepared.delivery.job_id == job.id


def test_a_stale_delivery_s_db_writes_never_reach_the_server_s_executor(
    pg_url: str, napp: App
) -> None:
    """G5.2 with everything sent at once: the step record's proofs fail first, so the server
    skips the statements sent after it. A sequence, which no rollback winds back, shows that
    its ``nextval`` never ran; a current delivery's does, once: run again, the step's record
    fails as a duplicate first, and its statements are skipped, not run and rolled back."""
    counter = stores.table(pg_url, "counter")
    stores.execute(pg_url, [f"CREATE SEQUENCE {counter}"])
    bump = (f"SELECT nextval('{counter}')", None)
    napp.tasks[BRIEF].enqueue(n=1, work_s=0.0)
    backend = napp.backend
    (prepared,) = backend.fetch_prepared(["default"], 1, "w", None)
    guard = guard_of(prepared.delivery)
    assert backend.begin(guard, BeginRequest(operation_key="seq:1")).busy is None
    stale = replace(guard, lease_token="not-" + guard.lease_token)
    with pytest.raises(LeaseLostError):
        backend.db_writes(stale, "seq:1", "bump", [bump])
    assert stores.query(pg_url, f"SELECT is_called FROM {counter}") == [(False,)]
    assert backend.db_writes(guard, "seq:1", "bump", [bump]) is True
    assert stores.query(pg_url, f"SELECT last_value, is_called FROM {counter}") == [(1, True)]
    assert backend.db_writes(guard, "seq:1", "bump", [bump]) is False
    assert stores.query(pg_url, f"SELECT last_value FROM {counter}") == [(1,)]
