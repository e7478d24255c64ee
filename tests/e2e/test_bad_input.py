"""Bad input at the door and in the store ().

What can be checked at enqueue is refused there with a typed error and nothing is stored. What
reaches a worker anyway (a row for a task this worker does not know, a payload corrupted in the
table) goes to the dead letter queue with its reason after one delivery, and the worker carries
on with the other jobs: no crash loop, nothing lost.
"""

from __future__ import annotations

import secrets
import threading
from pathlib import Path
from typing import Any

import psycopg
import pytest

from jobguard import (
    App,
    ConfigurationError,
    Context,
    JobStatus,
    Outcome,
    PayloadError,
    Retry,
    UnknownTaskError,
)
from jobguard.app import DEFAULT_MAX_PAYLOAD_BYTES
from jobguard.core.keys import MAX_KEY_LENGTH
from tests.support import stores
from tests.support.procs import spawn_worker, workers
from tests.support.queue_app import NOOP, make_app

NOTHING_STORED = dict.fromkeys(JobStatus, 0)


def register_echo(app: App) -> Any:
    """A task with one required and one optional argument."""

    @app.task(name="echo")
    def echo(ctx: Context, text: str, times: int = 1) -> str:
        return text * times

    return echo


def run_burst_within(app: App, queues: list[str] | None = None, timeout_s: float = 30.0) -> None:
    """A burst worker of two threads, stopped after ``timeout_s``: a fetch that fails is
    retried without end, and a test of a stalled queue must fail, not hang."""
    worker = app.worker(queues, concurrency=2, install_signal_handlers=False)
    stop = threading.Timer(timeout_s, worker.stop)
    stop.start()
    try:
        worker.run(burst=True)
    finally:
        stop.cancel()


def corrupt_payload(url: str, job_id: int, payload: str) -> None:
    """Overwrite a stored job's payload behind jobguard's back (a bad producer, a bad migration)."""
    update = f"UPDATE {stores.table(url, 'jobs')} SET payload = ? WHERE id = ?"
    stores.execute(url, [update], [(payload, job_id)])


def test_unknown_task_name_is_refused_at_enqueue_and_nothing_is_stored(app: App) -> None:
    """``app.enqueue`` with a name no task is registered under raises ``UnknownTaskError``.

    G7.1 (bad input is not retried, it is refused).
    """
    register_echo(app)
    with pytest.raises(UnknownTaskError, match=r"unknown task 'nope' \(registered: echo\)"):
        app.enqueue("nope", {})
    assert app.counts() == NOTHING_STORED


@pytest.mark.parametrize(
    "value",
    [object(), {1, 2}, b"bytes", float("nan"), float("inf")],
    ids=["object", "set", "bytes", "nan", "inf"],
)
def test_payload_that_is_not_json_is_refused_at_enqueue(app: App, value: object) -> None:
    """Arguments that are not plain JSON (no pickle, no NaN) raise ``PayloadError``."""
    echo = register_echo(app)
    with pytest.raises(PayloadError, match="must be JSON-serialisable"):
        echo.enqueue(text=value)
    with pytest.raises(PayloadError, match="must be JSON-serialisable"):
        app.enqueue("echo", {"text": value})
    assert app.counts() == NOTHING_STORED


def test_payload_over_the_default_1_mib_limit_is_refused_and_one_at_the_limit_is_stored(
    app: App,
) -> None:
    """The encoded payload may be 1 MiB at most by default; one byte more is a ``PayloadError``."""
    assert DEFAULT_MAX_PAYLOAD_BYTES == 1024 * 1024
    echo = register_echo(app)
    overhead = len('{"text":""}')
    at_limit = "x" * (DEFAULT_MAX_PAYLOAD_BYTES - overhead)
    with pytest.raises(PayloadError, match=r"payload is 1048577 bytes; the limit is 1048576 bytes"):
        echo.enqueue(text=at_limit + "x")
    assert app.counts() == NOTHING_STORED
    stored = echo.enqueue(text=at_limit)
    assert len(app.get_job(stored.id).payload.encode()) == DEFAULT_MAX_PAYLOAD_BYTES


@pytest.mark.parametrize(
    "queue",
    ["", "has space", "semi;colon", "dot.ted", "9starts-with-digit", "ünïcode", "q" * 65,
     "jobs'--"],
)  # fmt: skip
def test_queue_name_that_is_not_a_plain_identifier_is_refused(app: App, queue: str) -> None:
    """A queue name must be a plain identifier: refused when registering a task, per call at
    enqueue, and when starting a worker; nothing is stored.


    """
    echo = register_echo(app)
    with pytest.raises(ConfigurationError, match="is not a plain identifier"):
        app.task(name="elsewhere", queue=queue)(lambda ctx: None)
    with pytest.raises(ConfigurationError, match="is not a plain identifier"):
        echo.options(queue=queue).enqueue(text="hi")
    with pytest.raises(ConfigurationError, match="is not a plain identifier"):
        app.enqueue("echo", {"text": "hi"}, queue=queue)
    with pytest.raises(ConfigurationError, match="is not a plain identifier"):
        app.worker(queues=[queue])
    assert app.counts() == NOTHING_STORED


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"times": 2}, {"text": "hi", "colour": "red"}, {"ctx": 1, "text": "hi"}],
    ids=["missing", "missing-required", "unexpected", "ctx-as-argument"],
)
def test_arguments_that_do_not_match_the_handler_are_refused_at_enqueue(
    app: App, kwargs: dict[str, Any]
) -> None:
    """Arguments the handler cannot be called with raise ``PayloadError`` at enqueue."""
    echo = register_echo(app)
    with pytest.raises(PayloadError, match="arguments do not match the handler"):
        echo.enqueue(**kwargs)
    with pytest.raises(PayloadError, match="arguments do not match the handler"):
        app.enqueue("echo", kwargs)
    assert app.counts() == NOTHING_STORED


def test_rows_the_worker_cannot_run_land_in_the_dlq_with_their_reason_and_the_rest_complete(
    store_url: str,
) -> None:
    """A job of a task the worker does not know, and stored payloads that are not JSON, not an
    object, or do not fit the handler, are each buried after one delivery with the reason; the
    same worker completes every good job around them.

    G8.1, G1.1 (nothing lost).
    """
    url = store_url
    producer = App(url)
    worker_app = App(url)
    try:

        @producer.task(name="ghost")
        def ghost(ctx: Context) -> None:  # registered only where jobs are produced
            raise AssertionError("a worker without this task must never run it")

        register_echo(producer)
        register_echo(worker_app)
        echo = producer.tasks["echo"]

        good = [echo.enqueue(text=f"ok {i}") for i in range(3)]
        unknown = ghost.enqueue()
        bad_rows = {
            "payload is not valid JSON": echo.enqueue(text="soon corrupt"),
            "payload is not a JSON object but list": echo.enqueue(text="soon a list"),
            "payload does not match the handler's arguments": echo.enqueue(text="soon wrong"),
        }
        good += [echo.enqueue(text=f"ok {i}") for i in range(3, 6)]
        corrupt_payload(url, bad_rows["payload is not valid JSON"].id, '{"text": "half')
        corrupt_payload(url, bad_rows["payload is not a JSON object but list"].id, "[1, 2]")
        corrupt_payload(
            url, bad_rows["payload does not match the handler's arguments"].id, '{"txt": 1}'
        )

        stats = worker_app.worker(concurrency=2, install_signal_handlers=False).run(burst=True)

        assert stats.fetched == len(good) + 1 + len(bad_rows)  # one delivery each: no loop
        for job in good:
            assert worker_app.get_job(job.id).status == JobStatus.COMPLETED
        expected_reasons = {unknown.id: "unknown task 'ghost': no handler registered"}
        expected_reasons.update({job.id: reason for reason, job in bad_rows.items()})
        for job_id, reason in expected_reasons.items():
            dead = worker_app.dlq.show(job_id)
            assert reason in dead.reason
            [attempt] = dead.attempts
            assert attempt.outcome == Outcome.DEAD
            assert attempt.error_type == "Unrunnable"
            assert attempt.error_message is not None
            assert reason in attempt.error_message
        assert worker_app.counts() == {
            JobStatus.QUEUED: 0,
            JobStatus.RUNNING: 0,
            JobStatus.COMPLETED: len(good),
            JobStatus.DEAD: len(expected_reasons),
        }
    finally:
        producer.close()
        worker_app.close()


# Numbers no jobguard writes, as each store can hold them: any text in a SQLite column; NaN,
# infinity or a count out of range in PostgreSQL's typed ones.
STORED_NUMBERS = {
    "sqlite": {
        "visibility_timeout_s": "soon",
        "lock_ttl_s": "long",
        "soft_time_limit_s": "a while",
        "concurrency_limit": "two",
    },
    "postgres": {
        "visibility_timeout_s": float("nan"),
        "lock_ttl_s": float("inf"),
        "soft_time_limit_s": float("-inf"),
        "concurrency_limit": 0,
    },
}


def test_stored_numbers_no_jobguard_writes_bury_their_job_and_the_rest_complete(
    store_url: str,
) -> None:
    """A row whose lease length, lock length, time limit or concurrency limit is not a number
    of the kind jobguard writes (planted by another tool or by hand) is buried after one
    delivery, its reason naming the column and the value; the same worker runs every good job.
    Before, a text lease length on SQLite ended the worker's run with a TypeError. (A stored
    attempt limit is not among them: the fetch writes the worker's own over it.)"""
    app = App(store_url)
    try:
        echo = register_echo(app)
        good = [echo.enqueue(text=f"ok {i}") for i in range(3)]
        store = stores.kind_of(store_url)
        planted = {}
        for column, value in STORED_NUMBERS[store].items():
            job = echo.enqueue(text=column)
            update = f"UPDATE {stores.table(store_url, 'jobs')} SET {column} = ? WHERE id = ?"
            if column == "concurrency_limit":
                update = update.replace("SET", "SET concurrency_key = 'dock',")
            stores.execute(store_url, [update], [(value, job.id)])
            planted[column] = (job, value)
        good += [echo.enqueue(text=f"ok {i}") for i in range(3, 6)]

        stats = app.worker(concurrency=2, install_signal_handlers=False).run(burst=True)

        assert stats.fetched == len(good) + len(planted)  # one delivery each
        for job in good:
            assert app.get_job(job.id).status == JobStatus.COMPLETED
        for column, (job, value) in planted.items():
            dead = app.dlq.show(job.id)
            assert f"stored {column} {value!r} is not" in dead.reason
            [attempt] = dead.attempts
            assert attempt.outcome == Outcome.DEAD
            assert attempt.error_type == "Unrunnable"
    finally:
        app.close()


def test_a_lost_lease_whose_stored_attempt_count_is_text_is_buried_not_a_crash(
    tmp_path: Path,
) -> None:
    """SQLite: a job whose lease expired (its worker died) and whose attempt count was
    overwritten with text is closed as lost and buried by the next fetch, which cannot tell
    whether attempts are left; before, that fetch raised a TypeError and the worker stopped."""
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    app = App(url)
    try:
        echo = register_echo(app)
        planted = echo.enqueue(text="lost")
        rules = {"echo": app.tasks["echo"].delivery_rules()}
        [leased] = app.backend.fetch_prepared(["default"], 1, "gone-worker", rules)
        assert leased.delivery.job_id == planted.id
        update = "UPDATE jobs SET attempts = 'many', available_at = 0 WHERE id = ?"
        stores.execute(url, [update], [(planted.id,)])
        good = [echo.enqueue(text=f"ok {i}") for i in range(3)]

        app.worker(concurrency=2, install_signal_handlers=False).run(burst=True)

        assert [app.get_job(job.id).status for job in good] == [JobStatus.COMPLETED] * 3
        dead = app.dlq.show(planted.id)
        assert [a.outcome for a in dead.attempts] == [Outcome.LOST]
    finally:
        app.close()


# The largest count each store's columns hold: PostgreSQL's integer, SQLite's 64-bit one.
LARGEST_COUNT = {"postgres": 2**31 - 1, "sqlite": 2**63 - 1}


def test_a_count_stored_at_its_largest_value_stops_no_other_job(store_url: str) -> None:
    """A count planted at the largest number its column holds cannot be counted up once more.
    On PostgreSQL a job's or its operation's attempt count there failed the fetch's statement
    ("integer out of range"), and every fetch after it: no job of the queue ran again; a
    deferral count there lost the deferral, and a dedup hit count failed the enqueue; on both
    stores a streak of one error counted past it lost the failure's ending. Now every count
    stops at its column's largest value on PostgreSQL (the job runs, with no attempt left after
    this one), a streak at 2**31 - 1 on both, a deferral or dedup hit count at its column's
    largest on both (on SQLite a deferral counted past it turned into a real number, and the
    job's next fetch buried it as unrunnable); on SQLite an attempt count overflows into a real
    number and the job is buried as unrunnable, the reason naming it. The other jobs run."""
    app = App(store_url)
    try:
        echo = register_echo(app)

        @app.task(name="flaky", operation_key="flaky:{n}")
        def flaky(ctx: Context, n: int) -> None:
            if ctx.attempt == 1:
                # A delay of its own: a backoff's full jitter may come out near zero, and the
                # retry would run in this burst.
                raise Retry("the first delivery fails; its operation row stays", delay_s=3600)

        @app.task(name="failing", max_attempts=10, backoff_base_s=60)
        def failing(ctx: Context) -> None:
            raise RuntimeError("the same error every time")

        @app.task(name="docked", resource_key="dock")
        def docked(ctx: Context) -> None:
            raise AssertionError("its lock is held by another holder: it is deferred")

        store = stores.kind_of(store_url)
        largest = LARGEST_COUNT[store]
        retried, streak = flaky.enqueue(n=1), failing.enqueue()
        app.worker(concurrency=1, install_signal_handlers=False).run(burst=True)
        for job in (retried, streak):
            assert app.get_job(job.id).status == JobStatus.QUEUED  # its retry waits
        counted = echo.enqueue(text="counted")
        deferred = docked.enqueue()
        held = echo.options(dedup_key="held").enqueue(text="held")
        good = [echo.enqueue(text=f"ok {i}") for i in range(4)]
        jobs, operations = stores.table(store_url, "jobs"), stores.table(store_url, "operations")
        locks = stores.table(store_url, "locks")
        for update, row in [
            (f"UPDATE {jobs} SET attempts = ? WHERE id = ?", (largest, counted.id)),
            (f"UPDATE {jobs} SET available_at = 0 WHERE id = ?", (retried.id,)),
            (
                f"UPDATE {jobs} SET same_error_count = ?, available_at = 0 WHERE id = ?",
                (largest, streak.id),
            ),
            (f"UPDATE {operations} SET attempts = ? WHERE key = ?", (largest, "flaky:1")),
            (f"UPDATE {jobs} SET deferrals = ? WHERE id = ?", (largest, deferred.id)),
            (f"UPDATE {jobs} SET dedup_hits = ? WHERE id = ?", (largest, held.id)),
            (
                f"INSERT INTO {locks} (resource, owner, fence, expires_at) VALUES (?, ?, 1, ?)",
                ("dock", "another holder", 4e9),
            ),
        ]:
            stores.execute(store_url, [update], [row])
        # A dedup hit counts up the holder's hits: at their largest, the enqueue still answers.
        assert echo.options(dedup_key="held").enqueue(text="again").id == held.id

        run_burst_within(app)

        assert [app.get_job(job.id).status for job in good] == [JobStatus.COMPLETED] * 4
        # Its deferral's jitter may have let this burst fetch it again, or not: fetch it once
        # more for certain, so a count that could not stay at its largest shows on both stores.
        stores.execute(
            store_url, [f"UPDATE {jobs} SET available_at = 0 WHERE id = ?"], [(deferred.id,)]
        )
        run_burst_within(app)
        assert app.get_job(deferred.id).status == JobStatus.QUEUED  # deferred, not lost
        assert app.get_job(deferred.id).deferrals == largest
        # The streak's next failure was written (retried or buried), its count at 2**31 - 1.
        assert app.get_job(streak.id).status in (JobStatus.QUEUED, JobStatus.DEAD)
        [(streak_count,)] = stores.query(
            store_url, f"SELECT same_error_count FROM {jobs} WHERE id = ?", [streak.id]
        )
        assert streak_count == 2**31 - 1
        [(hits,)] = stores.query(
            store_url, f"SELECT dedup_hits FROM {jobs} WHERE id = ?", [held.id]
        )
        assert hits == largest  # an integer still, at its largest
        if store == "postgres":
            for job in (counted, retried):
                assert app.get_job(job.id).status == JobStatus.COMPLETED
            assert app.get_job(counted.id).attempts == largest
            operation = app.backend.get_operation("flaky:1")
            assert operation is not None
            assert operation.attempts == largest
        else:
            assert "stored attempts" in app.dlq.show(counted.id).reason
            assert app.get_job(retried.id).status == JobStatus.COMPLETED
    finally:
        app.close()


# The largest fence each store's columns hold: a 64-bit integer on both.
LARGEST_FENCE = 2**63 - 1


def test_a_fence_stored_at_its_largest_value_stops_no_other_job(store_url: str) -> None:
    """A lock's or a slot's fence written by hand at the largest integer its column holds
    cannot grow. Before, granting that lock or slot failed PostgreSQL's fetch ("bigint out of
    range"), and every fetch after it: no job of the queue ran again (SQLite went on, its fence
    turned into a real number). Now neither store grants it again: the job that wants it waits
    as for a busy one, buried as waited once past its max_defer_s; another slot of the same key
    is taken where the limit leaves one; every other job runs."""
    app = App(store_url)
    try:
        echo = register_echo(app)

        @app.task(name="locked", resource_key="dock", max_defer_s=0.001)
        def locked(ctx: Context) -> None:
            raise AssertionError("its lock cannot be granted")

        # Slots on a queue of their own: a batch asking for one takes the long way of the
        # fetch, and the lock's job, alone on its queue, the one statement of lease_and_begin.
        @app.task(
            name="slotted",
            queue="slots",
            concurrency_key="bay",
            concurrency_limit=1,
            max_defer_s=0.001,
        )
        def slotted(ctx: Context) -> None:
            raise AssertionError("its only slot cannot be granted")

        @app.task(name="roomy", queue="slots", concurrency_key="yard", concurrency_limit=2)
        def roomy(ctx: Context) -> None:
            pass

        waiting = [locked.enqueue(), slotted.enqueue()]
        good = [roomy.enqueue(), *(echo.enqueue(text=f"ok {i}") for i in range(3))]
        locks, slots = stores.table(store_url, "locks"), stores.table(store_url, "slots")
        stores.execute(
            store_url,
            [f"INSERT INTO {locks} (resource, owner, fence, expires_at) VALUES (?, NULL, ?, NULL)"],
            [("dock", LARGEST_FENCE)],
        )
        stores.execute(
            store_url,
            [f"INSERT INTO {slots} (key, slot, owner, fence) VALUES (?, 0, NULL, ?)"],
            [("bay", LARGEST_FENCE), ("yard", LARGEST_FENCE)],
        )

        run_burst_within(app, ["default", "slots"])

        assert [app.get_job(job.id).status for job in good] == [JobStatus.COMPLETED] * 4
        for job in waiting:
            assert "longer than max_defer_s=0.001" in app.dlq.show(job.id).reason
        assert stores.query(store_url, f"SELECT fence FROM {locks}") == [(LARGEST_FENCE,)]
        assert stores.query(
            store_url, f"SELECT key, slot, fence FROM {slots} ORDER BY key, slot"
        ) == [
            ("bay", 0, LARGEST_FENCE),
            ("yard", 0, LARGEST_FENCE),
            ("yard", 1, 1),
        ]
    finally:
        app.close()


KEY_COLUMNS = ("operation_key", "resource_key", "concurrency_key", "dedup_key")


def test_a_key_longer_than_an_enqueue_allows_stops_no_other_job(store_url: str) -> None:
    """A key of more than MAX_KEY_LENGTH characters written by hand into a job's row. Before,
    PostgreSQL stored it, and every fetch of its queue failed after it (the lock, operation or
    attempt row the fetch writes for it is larger than an index holds: "index row requires
    12016 bytes"): no job of the queue ran again. Now PostgreSQL refuses the write, naming the
    constraint, and a key of the longest length an enqueue allows is still stored. SQLite,
    whose indexes take any length, holds the key and runs the job up to its step, which no
    store takes with that key. Either way the worker runs every other job of the queue."""
    app = App(store_url)
    try:
        echo = register_echo(app)

        @app.task(
            name="keyed",
            operation_key="op:{n}",
            resource_key="res:{n}",
            concurrency_key="dock:{n}",
            concurrency_limit=1,
        )
        def keyed(ctx: Context, n: int) -> int:
            return ctx.step("write", lambda: n)

        planted = keyed.options(dedup_key="keyed:1").enqueue(n=1)
        longest = keyed.enqueue(n=2)
        good = [echo.enqueue(text=f"ok {i}") for i in range(3)]
        jobs = stores.table(store_url, "jobs")
        # Random, so that no compression makes the value small enough for an index.
        too_long = secrets.token_hex(6000)
        on_postgres = stores.kind_of(store_url) == "postgres"
        for column in KEY_COLUMNS:
            plant = [f"UPDATE {jobs} SET {column} = ? WHERE id = ?"], [(too_long, planted.id)]
            if on_postgres:
                with pytest.raises(psycopg.errors.CheckViolation, match="jobs_keys_fit"):
                    stores.execute(store_url, *plant)
            else:
                stores.execute(store_url, *plant)
        for column in ("resource_key", "operation_key"):
            update = f"UPDATE {jobs} SET {column} = ? WHERE id = ?"
            stores.execute(store_url, [update], [(column[0] * MAX_KEY_LENGTH, longest.id)])

        run_burst_within(app)

        for job in [*good, longest]:
            assert app.get_job(job.id).status == JobStatus.COMPLETED
        [(stored,)] = stores.query(
            store_url, f"SELECT resource_key FROM {jobs} WHERE id = ?", [planted.id]
        )
        if on_postgres:
            assert stored == "res:1"
            assert app.get_job(planted.id).status == JobStatus.COMPLETED
        else:
            # Held and run, until its step: a step's record could not be indexed with that key
            # on PostgreSQL, so no store takes it.
            assert stored == too_long
            dead = app.dlq.show(planted.id)
            assert "and the operation key together take 12005 bytes" in dead.reason
    finally:
        app.close()


@pytest.mark.chaos
def test_worker_process_buries_unrunnable_rows_and_keeps_working_without_a_crash_loop(
    store_url: str,
) -> None:
    """A real worker process given unrunnable rows between good jobs buries each once, runs the
    good ones, and exits 0 when idle (burst): no crash loop, nothing lost.

    G8.1, G1.1.
    """
    url = store_url
    producer = make_app(url)
    try:

        @producer.task(name="not_in_the_worker")
        def stray(ctx: Context) -> None:
            raise AssertionError("the worker process does not register this task")

        noop = producer.tasks[NOOP]
        jobs = [noop.enqueue(n=i) for i in range(5)]
        stray_job = stray.enqueue()
        corrupt = noop.enqueue(n=99)
        jobs += [noop.enqueue(n=i) for i in range(5, 10)]
        corrupt_payload(url, corrupt.id, "not json at all")

        proc = spawn_worker(url, "tests.support.queue_app", burst=True, concurrency=2)
        with workers(proc):
            proc.wait_ready()
            assert proc.wait(timeout_s=30) == 0

        for job in jobs:
            assert producer.get_job(job.id).status == JobStatus.COMPLETED
        for job_id, reason in [
            (stray_job.id, "unknown task 'not_in_the_worker'"),
            (corrupt.id, "payload is not valid JSON"),
        ]:
            dead = producer.dlq.show(job_id)
            assert reason in dead.reason
            assert [a.outcome for a in dead.attempts] == [Outcome.DEAD]
        assert producer.counts() == {
            JobStatus.QUEUED: 0,
            JobStatus.RUNNING: 0,
            JobStatus.COMPLETED: len(jobs),
            JobStatus.DEAD: 2,
        }
    finally:
        producer.close()
