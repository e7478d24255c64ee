"""Each host queue's drain rate with and without jobguard's guard (``python -m bench.hosts``).

For Celery, RQ and Dramatiq on Redis: ``--jobs`` messages are queued, then 2 worker processes at
the host's default concurrency drain them; every handler inserts one row into PostgreSQL (plain:
its own autocommit insert; guarded: ``ctx.db_step`` on a PostgreSQL store in the same database).
Prints each drain rate and guarded/plain. Each run gets a database of its own (dropped after)
and flushes the Redis database ``JOBGUARD_BENCH_REDIS`` (default 13) before it starts.

``--count N`` instead runs N guarded deliveries in this process, one after another, through
the guard every host's task calls (``HostGuard.run``, no broker), and prints the statements
and round trips to PostgreSQL each delivery costs, by name (as :mod:`bench.round_trips` counts
them): where the guarded drain's time goes.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
from pathlib import Path

import psycopg
import redis

from bench.measure import EFFECT_ROWS, read_effects
from bench.pgdb import scratch_database
from bench.procs import bench_env, start, stop, wait_for
from bench.round_trips import counting, statement_names
from jobguard.backends import migrate_store

REDIS_URL = os.environ.get("JOBGUARD_BENCH_REDIS", "redis://127.0.0.1:6379/13")
HOSTS = ("celery", "rq", "dramatiq")
WORKERS = 2


def worker_command(host: str) -> list[str]:
    """One worker process of ``host`` at its default concurrency, on the bench's tasks."""
    if host == "celery":
        app = "bench.host_tasks:celery_app"
        return [sys.executable, "-m", "celery", "-A", app, "worker", "-Q", "bench",
                "--without-gossip", "--without-mingle", "--loglevel=WARNING"]  # fmt: skip
    if host == "rq":
        # RQ's CLI with the tasks module imported first, as RQ's docs preload libraries: each
        # forked work-horse inherits it instead of importing it for every job.
        cli = "import bench.host_tasks; from rq.cli import main; main()"
        return [sys.executable, "-c", cli, "worker", "-u", REDIS_URL, "--with-scheduler",
                "--quiet", "bench"]  # fmt: skip
    return [sys.executable, "-m", "dramatiq", "bench.host_tasks", "--processes", "1",
            "--queues", "bench"]  # fmt: skip


def drain(host: str, mode: str, jobs: int, log: Path) -> float:
    """Queue ``jobs`` messages, drain them with 2 workers; jobs per second, first handler start
    to last row written."""
    client = redis.Redis.from_url(REDIS_URL)
    client.flushdb()
    with scratch_database() as url:
        migrate_store(f"{url}?schema=jobguard_bench")
        env = bench_env(JOBGUARD_BENCH_URL=url, JOBGUARD_BENCH_REDIS=REDIS_URL)
        os.environ.update(JOBGUARD_BENCH_URL=url, JOBGUARD_BENCH_REDIS=REDIS_URL)
        # The producer's side of the tasks module, made from this run's database.
        tasks = importlib.reload(importlib.import_module("bench.host_tasks"))
        for n in range(jobs):
            tasks.send(host, mode, n)
        procs = start(worker_command(host), WORKERS, env, log)
        try:
            with psycopg.connect(url, autocommit=True) as conn:

                def drained() -> bool:
                    row = conn.execute("SELECT count(*) FROM bench_effects").fetchone()
                    return row is not None and row[0] >= jobs

                wait_for(drained, 60 + jobs * 0.5, f"{host} {mode} drain")
                effects = read_effects(conn.execute(EFFECT_ROWS).fetchall())
        finally:
            stop(procs)
            tasks.store.close()
    client.flushdb()
    return jobs / effects.span_s


def count(deliveries: int) -> None:
    """Run ``deliveries`` guarded deliveries in-process and print their statements per job."""
    with scratch_database() as url:
        migrate_store(f"{url}?schema=jobguard_bench")
        os.environ.update(JOBGUARD_BENCH_URL=url, JOBGUARD_BENCH_REDIS=REDIS_URL)
        tasks = importlib.reload(importlib.import_module("bench.host_tasks"))
        guard = tasks.rq_guard
        guard.run("bench.rq_guarded", {"n": -1, "t": time.time()}, "warm-up")  # connections
        names = statement_names("jobguard_bench")
        try:
            with counting(names) as (counts, waits):
                for n in range(deliveries):
                    verdict = guard.run("bench.rq_guarded", {"n": n, "t": time.time()}, f"d{n}")
                    assert verdict.verdict == "ack", verdict
        finally:
            guard.close()
            tasks.store.close()
    print(f"{deliveries} guarded deliveries in one process, one after another")
    print(f"round trips per delivery: {sum(waits.values()) / deliveries:.1f}")
    print(f"statements per delivery: {sum(counts.values()) / deliveries:.1f}")
    for name, found in counts.most_common():
        print(f"{found / deliveries:7.2f}  {name}")


def jobs_per_host(given: str, hosts: list[str]) -> dict[str, int]:
    """``--jobs``: one count for every host, or ``host=N`` pairs."""
    try:
        if "=" not in given:
            return dict.fromkeys(hosts, int(given))
        pairs = dict(item.split("=", 1) for item in given.split(","))
        return {host: int(pairs[host]) for host in hosts}
    except (KeyError, ValueError) as exc:
        raise SystemExit(
            f"--jobs: give N or host=N for each of {', '.join(hosts)} ({exc})"
        ) from None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--jobs",
        default="200",
        help="messages per drain: N for every host, or per host (celery=N,rq=N,dramatiq=N)",
    )
    parser.add_argument("--hosts", default=",".join(HOSTS), help="comma-separated")
    parser.add_argument("--count", type=int, default=0, help="count statements instead")
    args = parser.parse_args()
    if args.count:
        count(args.count)
        return
    log = Path("bench-hosts.log").resolve()
    print(f"{WORKERS} worker processes per host at its default concurrency, one PostgreSQL row")
    print(f"per message; load average at start: {os.getloadavg()[0]:.2f}")
    print(f"{'host':<10}{'jobs':>7}{'plain jobs/s':>14}{'guarded jobs/s':>16}{'guarded/plain':>15}")
    hosts = args.hosts.split(",")
    jobs = jobs_per_host(args.jobs, hosts)
    for host in hosts:
        plain = drain(host, "plain", jobs[host], log)
        time.sleep(1)
        guarded = drain(host, "guarded", jobs[host], log)
        row = f"{host:<10}{jobs[host]:>7}{plain:>14.0f}{guarded:>16.0f}{guarded / plain:>15.2f}"
        print(row, flush=True)


if __name__ == "__main__":
    main()
