"""An outage never buries work (#18), with real worker processes on both backends.

jobguard's own store failing under a ``ctx.db_step`` (the SQLite file locked past its busy
timeout; the step's PostgreSQL connection terminated by the server) is retried with backoff,
never fatal and never poison, whatever the task's ``transient=`` says; and a mail API that
answers 503 for a while buries none of the jobs that call it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from jobguard import App, JobStatus, Outcome
from tests.support import stores
from tests.support.outage_app import (
    HOSTILE_COMMIT,
    HOSTILE_ROWS,
    MAIL,
    MAIL_URL_ENV,
    STORE_OUTAGE,
    STORE_OUTAGE_DECLARED,
    make_app,
    read_events,
)
from tests.support.procs import spawn_worker, wait_until, workers

pytestmark = pytest.mark.chaos

APP_MODULE = "tests.support.outage_app"


@pytest.fixture
def oapp(store_url: str) -> Iterator[App]:
    """The producer side of ``outage_app`` (schema created before any worker starts)."""
    application = make_app(store_url)
    _ = application.backend
    yield application
    application.close()


def settled(app: App, job_ids: list[int]) -> bool:
    """Whether every job has ended (completed or dead)."""
    return all(
        app.get_job(job_id).status in (JobStatus.COMPLETED, JobStatus.DEAD) for job_id in job_ids
    )


@pytest.mark.parametrize("task", [STORE_OUTAGE, STORE_OUTAGE_DECLARED])
def test_a_store_failure_under_a_db_step_is_retried_never_fatal_nor_poison(
    store_url: str, oapp: App, task: str
) -> None:
    """Three store failures in a row (the poison threshold) and then success: the job
    completes on its fourth attempt, with or without a ``transient=`` list that does not name
    jobguard's errors."""
    job = oapp.tasks[task].enqueue(n=1, failing=3)
    with workers(spawn_worker(store_url, APP_MODULE, concurrency=1)) as (proc,):
        proc.wait_ready()
        wait_until(lambda: settled(oapp, [job.id]), timeout_s=60)
    final = oapp.get_job(job.id)
    assert final.status is JobStatus.COMPLETED, final.dead_reason
    outcomes = [a.outcome for a in oapp.attempts(job_id=job.id)]
    assert outcomes == [Outcome.RETRY, Outcome.RETRY, Outcome.RETRY, Outcome.COMPLETED]
    assert all(a.error_type == "StoreUnavailableError" for a in oapp.attempts(job_id=job.id)[:3])
    done = [e for e in read_events(store_url) if e["what"] == "done"]
    assert [e["attempt"] for e in done] == [4]


def test_a_db_step_cannot_commit_its_rows_on_its_own(store_url: str, oapp: App) -> None:
    """A db_step whose SQL text commits by itself (``INSERT …; COMMIT; BEGIN``) and then fails
    on two of three deliveries leaves no row behind: the step's transaction cannot be ended from
    inside it, so its rows are only ever kept with its step record."""
    stores.execute(store_url, [f"CREATE TABLE {stores.table(store_url, HOSTILE_ROWS)} (n INTEGER)"])
    job = oapp.tasks[HOSTILE_COMMIT].enqueue(n=1)
    with workers(spawn_worker(store_url, APP_MODULE, concurrency=1)) as (proc,):
        proc.wait_ready()
        wait_until(lambda: settled(oapp, [job.id]), timeout_s=60)
    rows = stores.query(store_url, f"SELECT count(*) FROM {stores.table(store_url, HOSTILE_ROWS)}")
    assert rows == [(0,)]
    final = oapp.get_job(job.id)
    assert final.status is JobStatus.DEAD
    assert {a.error_type for a in oapp.attempts(job_id=job.id)} == {"StepSQLError"}


class MailAPI:
    """A real local HTTP service that answers 503 until :meth:`recover`, then 200."""

    def __init__(self) -> None:
        self.down = True
        self.calls_while_down = 0
        self.lock = threading.Lock()
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with api.lock:
                    down = api.down
                    api.calls_while_down += down
                self.send_response(503 if down else 200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        """Where the service listens."""
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}/send"

    def recover(self) -> None:
        """From now on every call succeeds."""
        with self.lock:
            self.down = False

    def close(self) -> None:
        """Stop serving."""
        self.server.shutdown()
        self.server.server_close()


def test_an_http_outage_buries_nothing_and_every_job_completes(store_url: str, oapp: App) -> None:
    """Five jobs call a mail API that answers 503 (``raise_for_status()``: the same
    ``HTTPStatusError`` again and again) until every job has failed more often than the poison
    threshold; when the API is back, every job completes and none was buried."""
    api = MailAPI()
    try:
        jobs = [oapp.tasks[MAIL].enqueue(n=n) for n in range(5)]
        env = {MAIL_URL_ENV: api.url}
        procs = [spawn_worker(store_url, APP_MODULE, concurrency=2, env=env) for _ in range(2)]
        with workers(*procs):
            for proc in procs:
                proc.wait_ready()

            def each_failed_past_the_threshold() -> bool:
                calls = [e["job"] for e in read_events(store_url) if e["what"] == "call"]
                return all(calls.count(job.id) >= 4 for job in jobs) or settled(
                    oapp, [job.id for job in jobs]
                )

            wait_until(each_failed_past_the_threshold, timeout_s=90)
            api.recover()
            wait_until(lambda: settled(oapp, [job.id for job in jobs]), timeout_s=90)
        assert [oapp.get_job(job.id).dead_reason for job in jobs] == [None] * 5
        assert all(oapp.get_job(job.id).status is JobStatus.COMPLETED for job in jobs)
        assert api.calls_while_down >= 5 * 3  # every job failed past the poison threshold
    finally:
        api.close()
