"""Dashboard pages and metrics scrapes on a large store; worker throughput with observability.

Usage (from the repository root, in the project's virtualenv)::

    python -m bench.observability                      # 1,000,000 jobs, 5,000,000 attempts
    python -m bench.observability --jobs 100000 --attempts-per-job 5 --requests 50
    python -m bench.observability --postgres postgresql://postgres@127.0.0.1:5432/postgres

1. Builds a SQLite store (through the real migrations) with ``--jobs`` jobs, 97% completed, 1%
   dead, the rest queued or running, and ``--attempts-per-job`` attempts each, written with
   set-based SQL (minutes, not hours). Kept with ``--keep DIR`` to rerun the reads.
2. Starts the real ``jobguard dashboard`` and ``jobguard exporter`` on it and times
   ``--requests`` HTTP requests per page (random job ids for the job page): p50, p95, max.
3. Drains ``--drain-jobs`` guarded jobs (lease + lock + operation + one step) with one in-process
   worker with no hooks, with metrics, with metrics and tracing through the OpenTelemetry API
   alone, and with metrics and tracing recorded by the SDK (see :func:`drain`), the modes taken
   in turn ``--rounds`` times: jobs/s, best and median.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from jobguard.diagnostics.durations import percentile

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

    from jobguard.hooks import Hooks

REPO_ROOT = Path(__file__).resolve().parents[1]

BUILD_JOBS = """
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < :jobs)
INSERT INTO jobs (id, task, queue, payload, status, priority, available_at, run_at, attempts,
                  max_attempts, visibility_timeout_s, lease_token, worker_id, operation_key,
                  resource_key, lock_ttl_s, created_at, finished_at, dead_reason, last_error)
SELECT i,
       'task' || (i % 8), 'queue' || (i % 4),
       '{"order_id": ' || i || ', "note": "bench"}',
       CASE WHEN i > :jobs - :queued THEN 'queued'
            WHEN i > :jobs - :queued - :running THEN 'running'
            WHEN i % 100 = 0 THEN 'dead' ELSE 'completed' END,
       0,
       CASE WHEN i > :jobs - :queued THEN :now - (:jobs - i) * 0.01
            WHEN i > :jobs - :queued - :running THEN :now + 30 END,
       :t0 + i * :step, :per_job, :per_job + 1, 30.0,
       CASE WHEN i > :jobs - :queued - :running AND i <= :jobs - :queued
            THEN 'lease' || i END,
       'w' || (i % 16),
       'op:' || i, 'res:' || (i % 1000), 30.0,
       :t0 + i * :step,
       CASE WHEN i <= :jobs - :queued - :running THEN :t0 + i * :step + 1 END,
       CASE WHEN i % 100 = 0 AND i <= :jobs - :queued - :running
            THEN 'attempts exhausted' END,
       CASE WHEN i % 100 = 0 THEN 'RuntimeError: upstream failed' END
FROM n;
"""

BUILD_ATTEMPTS = """
WITH RECURSIVE a(k) AS (SELECT 1 UNION ALL SELECT k + 1 FROM a WHERE k < :per_job)
INSERT INTO attempts (job_id, attempt, task, queue, operation_key, worker_id, lease_token,
                      lock_owner, fence, started_at, ended_at, duration_s, outcome, error_type,
                      error_message, steps_run, steps_skipped)
SELECT j.id, a.k, j.task, j.queue, j.operation_key, j.worker_id,
       CASE WHEN j.status = 'running' AND a.k = :per_job THEN j.lease_token
            ELSE 'l' || j.id || '-' || a.k END,
       'w' || (j.id % 16) || '/lock', a.k, j.created_at + a.k * 0.2,
       CASE WHEN j.status = 'running' AND a.k = :per_job THEN NULL
            ELSE j.created_at + a.k * 0.2 + 0.05 + (j.id % 37) * 0.003 END,
       CASE WHEN j.status = 'running' AND a.k = :per_job THEN NULL
            ELSE 0.05 + (j.id % 37) * 0.003 END,
       CASE WHEN j.status = 'running' AND a.k = :per_job THEN 'running'
            WHEN a.k < :per_job THEN 'retry'
            WHEN j.status = 'dead' THEN 'dead' ELSE 'completed' END,
       CASE WHEN a.k < :per_job OR j.status = 'dead' THEN 'RuntimeError' END,
       CASE WHEN a.k < :per_job OR j.status = 'dead' THEN 'upstream failed' END,
       1, 0
FROM jobs j CROSS JOIN a
WHERE j.status != 'queued' AND j.id BETWEEN :low AND :high;
"""


PG_BUILD_JOBS = """
INSERT INTO jobs (task, queue, payload, status, priority, available_at, run_at, attempts,
                  max_attempts, visibility_timeout_s, lease_token, worker_id, operation_key,
                  resource_key, lock_ttl_s, created_at, finished_at, dead_reason, last_error)
SELECT 'task' || (i % 8), 'queue' || (i % 4),
       '{"order_id": ' || i || ', "note": "bench"}',
       CASE WHEN i > %(jobs)s - %(queued)s THEN 'queued'
            WHEN i > %(jobs)s - %(queued)s - %(running)s THEN 'running'
            WHEN i %% 100 = 0 THEN 'dead' ELSE 'completed' END,
       0,
       CASE WHEN i > %(jobs)s - %(queued)s THEN %(now)s - (%(jobs)s - i) * 0.01
            WHEN i > %(jobs)s - %(queued)s - %(running)s THEN %(now)s + 30 END,
       %(t0)s + i * %(step)s, %(per_job)s, %(per_job)s + 1, 30.0,
       CASE WHEN i > %(jobs)s - %(queued)s - %(running)s AND i <= %(jobs)s - %(queued)s
            THEN 'lease' || i END,
       'w' || (i %% 16), 'op:' || i, 'res:' || (i %% 1000), 30.0,
       %(t0)s + i * %(step)s,
       CASE WHEN i <= %(jobs)s - %(queued)s - %(running)s THEN %(t0)s + i * %(step)s + 1 END,
       CASE WHEN i %% 100 = 0 AND i <= %(jobs)s - %(queued)s - %(running)s
            THEN 'attempts exhausted' END,
       CASE WHEN i %% 100 = 0 THEN 'RuntimeError: upstream failed' END
FROM generate_series(1, %(jobs)s) AS i ORDER BY i;
"""

PG_BUILD_ATTEMPTS = """
INSERT INTO attempts (job_id, attempt, task, queue, operation_key, worker_id, lease_token,
                      lock_owner, fence, started_at, ended_at, duration_s, outcome, error_type,
                      error_message, steps_run, steps_skipped)
SELECT j.id, k, j.task, j.queue, j.operation_key, j.worker_id,
       CASE WHEN j.status = 'running' AND k = %(per_job)s THEN j.lease_token
            ELSE 'l' || j.id || '-' || k END,
       'w' || (j.id %% 16) || '/lock', k, j.created_at + k * 0.2,
       CASE WHEN j.status = 'running' AND k = %(per_job)s THEN NULL
            ELSE j.created_at + k * 0.2 + 0.05 + (j.id %% 37) * 0.003 END,
       CASE WHEN j.status = 'running' AND k = %(per_job)s THEN NULL
            ELSE 0.05 + (j.id %% 37) * 0.003 END,
       CASE WHEN j.status = 'running' AND k = %(per_job)s THEN 'running'
            WHEN k < %(per_job)s THEN 'retry'
            WHEN j.status = 'dead' THEN 'dead' ELSE 'completed' END,
       CASE WHEN k < %(per_job)s OR j.status = 'dead' THEN 'RuntimeError' END,
       CASE WHEN k < %(per_job)s OR j.status = 'dead' THEN 'upstream failed' END,
       1, 0
FROM jobs j CROSS JOIN generate_series(1, %(per_job)s) AS k
WHERE j.status != 'queued' AND j.id BETWEEN %(low)s AND %(high)s
ORDER BY j.id, k;
"""


def build_params(jobs: int, per_job: int) -> dict[str, float | int]:
    """The shape of the large store: 1% dead, up to 10,000 queued and 200 running."""
    now = time.time()
    t0 = now - 7 * 86400
    return {
        "jobs": jobs,
        "queued": min(10_000, jobs // 100),
        "running": min(200, jobs // 1000),
        "now": now,
        "t0": t0,
        "step": (now - 60 - t0) / jobs,
        "per_job": per_job,
    }


def build_postgres(admin_url: str, jobs: int, per_job: int) -> tuple[str, str]:
    """A new database with a migrated, filled store; return (store URL, database URL)."""
    import psycopg
    from psycopg import sql

    from jobguard.backends.postgres.migrate import migrate_url

    name = f"jobguard_bench_{os.getpid()}_{random.randrange(16**6):06x}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    database = admin_url.rsplit("/", 1)[0] + f"/{name}"
    url = f"{database}?schema=jobguard"
    migrate_url(url)
    params = build_params(jobs, per_job)
    with psycopg.connect(database, autocommit=True) as conn:
        conn.execute("SET search_path TO jobguard")
        conn.execute(PG_BUILD_JOBS, params)
        for low in range(1, jobs + 1, 200_000):
            conn.execute(PG_BUILD_ATTEMPTS, {"per_job": per_job, "low": low, "high": low + 199_999})
        conn.execute("VACUUM ANALYZE")
    return url, database


def drop_postgres(admin_url: str, database: str) -> None:
    """Drop the database :func:`build_postgres` made."""
    import psycopg
    from psycopg import sql

    name = database.rsplit("/", 1)[1]
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


def build_store(path: Path, jobs: int, per_job: int) -> None:
    """Create the store with the real migrations, then fill it with set-based inserts."""
    from jobguard.backends.sqlite import SQLiteBackend

    SQLiteBackend(str(path)).close()
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA synchronous=OFF")
    params = build_params(jobs, per_job)
    conn.execute("BEGIN")
    conn.execute(BUILD_JOBS, params)
    conn.execute("COMMIT")
    chunk = 100_000
    for low in range(1, jobs + 1, chunk):
        conn.execute("BEGIN")
        conn.execute(BUILD_ATTEMPTS, {"per_job": per_job, "low": low, "high": low + chunk - 1})
        conn.execute("COMMIT")
    conn.execute("ANALYZE")
    conn.close()


def serve(args: list[str], marker: str) -> tuple[subprocess.Popen[str], str]:
    """Start a serving ``jobguard`` command; return it with the URL it printed."""
    popen = subprocess.Popen(
        [sys.executable, "-c", "from jobguard.cli.main import main; main()", *args],
        cwd=REPO_ROOT,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    assert popen.stderr is not None
    line = popen.stderr.readline()
    if marker not in line:
        popen.kill()
        raise RuntimeError(f"{args} did not start: {line}")
    url = next(word for word in line.split() if word.startswith("http"))
    return popen, url.rstrip("/")


def time_requests(urls: Sequence[str]) -> tuple[float, float, float]:
    """p50, p95 and max milliseconds of GETting each URL once (after one warm-up)."""
    with urllib.request.urlopen(urls[0], timeout=120) as response:  # noqa: S310 - local URL
        response.read()
    timings = []
    for url in urls:
        started = time.perf_counter()
        with urllib.request.urlopen(url, timeout=120) as response:  # noqa: S310 - local URL
            response.read()
            assert response.status == 200, url
        timings.append((time.perf_counter() - started) * 1000)
    timings.sort()
    return percentile(timings, 50), percentile(timings, 95), timings[-1]


MODES = (
    "off",
    "metrics",
    "metrics+tracing(api)",
    "metrics+tracing(sdk 10%)",
    "metrics+tracing(sdk)",
)


def hooks_for(mode: str) -> tuple[Hooks, TracerProvider]:
    """The hooks of a mode, and the SDK provider to shut down after (unused by most modes)."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
    from prometheus_client import CollectorRegistry

    from jobguard import HookChain, Hooks
    from jobguard.observability.metrics import MetricsHooks
    from jobguard.observability.tracing import TracingHooks

    class Drop(SpanExporter):
        def export(self, spans: object) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    sampled = "10%" in mode
    provider = TracerProvider(sampler=ParentBased(TraceIdRatioBased(0.1)) if sampled else None)
    provider.add_span_processor(BatchSpanProcessor(Drop()))
    if mode == "off":
        return Hooks(), provider
    metrics = MetricsHooks(CollectorRegistry())
    if mode == "metrics":
        return metrics, provider
    if mode == "metrics+tracing(api)":
        return HookChain(metrics, TracingHooks()), provider
    return HookChain(metrics, TracingHooks(provider)), provider


def hook_cost_us(mode: str, deliveries: int = 20000) -> float:
    """Microseconds the hooks of ``mode`` add to one delivery (enqueue excluded), one thread.

    Calls exactly what the pipeline calls for a delivery with one step; steadier than a drain
    on a shared machine, where other load moves jobs/s by more than the hooks cost.
    """
    from jobguard.hooks import AttemptEvent
    from jobguard.models import Delivery, Outcome

    hooks, provider = hooks_for(mode)
    events = []
    for n in range(deliveries):
        delivery = Delivery(
            job_id=n, task="guarded", queue="default", payload="{}", attempt=1,
            max_attempts=5, deferrals=0, created_at=0.0, lease_token=f"lease-{n}",
            attempt_id=n, lease_expires_at=30.0, visibility_timeout_s=30.0,
            operation_key=f"op:{n}", resource_key=f"res:{n}", lock_ttl_s=30.0,
            error_signature=None, same_error_count=0,
        )  # fmt: skip
        events.append(AttemptEvent(delivery, "w1", Outcome.COMPLETED, 0.001, "w1/lock", n, 1))
    started = time.perf_counter()
    for event in events:
        with hooks.delivering(event.delivery), hooks.running_step(event.delivery, "one"):
            pass
        hooks.attempt_ended(event)
        hooks.delivery_settled(event.delivery, event.outcome, event.duration_s)
    elapsed = time.perf_counter() - started
    provider.shutdown()
    return elapsed / deliveries * 1e6


def drain(db: Path, jobs: int, mode: str) -> float:
    """Jobs/s of one in-process worker draining ``jobs`` guarded jobs with the hooks of ``mode``.

    ``tracing(api)``: TracingHooks with no SDK installed (what a library user who has not set
    one up pays); ``tracing(sdk)``: the SDK recording every span through a batch processor to an
    exporter that drops them (the cost of sampling everything, before any network);
    ``sdk 10%``: the same SDK sampling one trace in ten.
    """
    from jobguard import App, Context

    hooks, provider = hooks_for(mode)
    app = App(f"sqlite:///{db}", hooks=hooks)

    @app.task(name="guarded", operation_key="op:{n}", resource_key="res:{n}")
    def guarded(ctx: Context, n: int) -> None:
        ctx.step("one", lambda: n)

    guarded.enqueue_many([{"n": n} for n in range(jobs)])
    started = time.perf_counter()
    app.worker(install_signal_handlers=False, concurrency=16).run(burst=True)
    elapsed = time.perf_counter() - started
    app.close()
    provider.shutdown()
    return jobs / elapsed


def main() -> None:
    """Run the three measurements and print one line each."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--attempts-per-job", type=int, default=5)
    parser.add_argument("--requests", type=int, default=50)
    parser.add_argument("--drain-jobs", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--keep", type=Path, default=None, help="build or reuse the store here")
    parser.add_argument("--skip-pages", action="store_true", help="only the worker figures")
    parser.add_argument(
        "--postgres",
        metavar="ADMIN_URL",
        default=None,
        help="time the pages on PostgreSQL instead: a new database is made there and dropped",
    )
    args = parser.parse_args()
    if args.postgres:
        print(f"PostgreSQL: {args.postgres.split('@')[-1]}")
        started = time.perf_counter()
        url, database = build_postgres(args.postgres, args.jobs, args.attempts_per_job)
        print(
            f"built the store ({args.jobs} jobs, about {args.jobs * args.attempts_per_job} "
            f"attempts) in {time.perf_counter() - started:.0f} s"
        )
        try:
            time_pages(url, args.jobs, args.requests)
        finally:
            drop_postgres(args.postgres, database)
        return
    workdir = args.keep or Path(tempfile.mkdtemp(prefix="jobguard-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    db = workdir / "large.db"
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}, SQLite {sqlite3.sqlite_version}"
    )
    if not db.exists():
        started = time.perf_counter()
        build_store(db, args.jobs, args.attempts_per_job)
        print(f"built the store in {time.perf_counter() - started:.0f} s")
    conn = sqlite3.connect(db)
    jobs = conn.execute("SELECT count(*) FROM jobs").fetchone()[0]
    attempts = conn.execute("SELECT max(id) FROM attempts").fetchone()[0]
    conn.close()
    print(f"store: {jobs} jobs, {attempts} attempts, {db.stat().st_size / 2**30:.1f} GiB")

    if not args.skip_pages:
        time_pages(f"sqlite:///{db}", jobs, args.requests)
    print("hook cost per delivery (one thread, 20,000 deliveries):")
    for mode in MODES:
        print(f"  {mode:26s} {hook_cost_us(mode):6.1f} us")
    drains(workdir, args.drain_jobs, args.rounds)
    if args.keep is None:
        shutil.rmtree(workdir, ignore_errors=True)


def time_pages(url: str, jobs: int, requests: int) -> None:
    """Time every dashboard page and an exporter scrape, served by the real commands."""
    rng = random.Random(7)
    dashboard, base = serve(["--url", url, "dashboard", "--port", "0"], "dashboard at")
    exporter, metrics = serve(["--url", url, "exporter", "--port", "0"], "exporter serving")
    try:
        pages = {
            "overview /": [f"{base}/"] * requests,
            "job page /jobs/ID": [f"{base}/jobs/{rng.randint(1, jobs)}" for _ in range(requests)],
            "jobs list /jobs": [f"{base}/jobs"] * requests,
            "jobs ?status=dead&page=20": [f"{base}/jobs?status=dead&page=20"] * requests,
            "dead letters /dlq": [f"{base}/dlq"] * requests,
            "operation ?key=op:ID": [
                f"{base}/operations?key=op:{rng.randint(1, jobs * 9 // 10)}"
                for _ in range(requests)
            ],
            "metrics scrape (exporter)": [metrics] * requests,
        }
        for name, urls in pages.items():
            p50, p95, worst = time_requests(urls)
            print(f"{name:28s} p50 {p50:7.1f} ms  p95 {p95:7.1f} ms  max {worst:7.1f} ms")
        p50, p95, worst = time_requests([f"{base}/doctor"] * 5)
        print(f"{'doctor /doctor (5 requests)':28s} p50 {p50:7.1f} ms  p95 {p95:7.1f} ms")
    finally:
        for proc in (dashboard, exporter):
            proc.terminate()
            proc.wait(timeout=30)
            if proc.stderr is not None:
                proc.stderr.close()


def drains(workdir: Path, drain_jobs: int, rounds: int) -> None:
    """Drain throughput per mode, the modes taken in turn ``rounds`` times."""
    results: dict[str, list[float]] = {mode: [] for mode in MODES}
    for round_no in range(rounds):  # modes interleaved, so drift hits each alike
        for mode in MODES:
            small = workdir / f"drain-{round_no}-{len(results[mode])}.db"
            results[mode].append(drain(small, drain_jobs, mode))
            for suffix in ("", "-wal", "-shm", ".wake"):
                Path(f"{small}{suffix}").unlink(missing_ok=True)
    base = max(results["off"])
    print(
        f"worker drain of {drain_jobs} guarded jobs, 1 process x 16 threads, "
        f"best of {rounds} rounds (median in brackets):"
    )
    for mode, found in results.items():
        best, median = max(found), sorted(found)[len(found) // 2]
        print(
            f"  {mode:26s} {best:6.0f} jobs/s ({median:.0f})  {(best / base - 1) * 100:+6.1f}% "
            "against off"
        )


if __name__ == "__main__":
    main()
