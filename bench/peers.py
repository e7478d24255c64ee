"""Run the peers beside jobguard: procrastinate (PostgreSQL) and dramatiq (Redis broker).

Each peer's handler inserts the benchmark's business row into the run's PostgreSQL database;
drain throughput and enqueue-to-handler delay are read back from those rows, the same way as
for jobguard's full-guard task.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import psycopg
import redis

from bench import procs
from bench.measure import EFFECT_ROWS, Cpu, Effects, Sent, load, pace, read_effects

DRAMATIQ_REDIS = "redis://127.0.0.1:6379/13"


class PeerDatabase:
    """The run's PostgreSQL database as the peers use it (``bench_effects`` in ``public``)."""

    def __init__(self, url: str) -> None:
        self.url = url

    def reset(self) -> None:
        """Empty the effect table."""
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute("TRUNCATE bench_effects")

    def count(self) -> int:
        """Rows written so far."""
        with psycopg.connect(self.url, autocommit=True) as conn:
            row = conn.execute("SELECT count(*) FROM bench_effects").fetchone()
        assert row is not None
        return int(row[0])

    def effects(self) -> Effects:
        """The rows written in this run."""
        with psycopg.connect(self.url, autocommit=True) as conn:
            return read_effects(conn.execute(EFFECT_ROWS).fetchall())


class Procrastinate:
    """procrastinate's own worker command, ``--concurrency`` per process."""

    name = "procrastinate"
    store = "PostgreSQL"

    def __init__(self, db: PeerDatabase, folder: Path) -> None:
        self.db = db
        self.log = folder / "procrastinate.log"
        self.module = load("bench.peer_procrastinate", db.url)
        with self.module.app.open():
            self.module.app.schema_manager.apply_schema()

    def _command(self, concurrency: int) -> list[str]:
        return [
            sys.executable,
            "-m",
            "procrastinate",
            "--app=bench.peer_procrastinate.app",
            "--log-level=warning",  # no line per job: jobguard logs none either
            "worker",
            f"--concurrency={concurrency}",
            "--queues=bench",
        ]

    def _clear(self) -> None:
        self.db.reset()
        with psycopg.connect(self.db.url, autocommit=True) as conn:
            conn.execute("DELETE FROM procrastinate_jobs")

    def drain(self, jobs: int, workers: int, concurrency: int) -> tuple[Effects, float, Cpu]:
        """Prefill ``jobs``, drain them; the rows, the wall time from process start, the CPU."""
        self._clear()
        now = time.time()
        with self.module.app.open():
            for start in range(0, jobs, 1000):
                batch = [{"n": n, "t": now} for n in range(start, min(jobs, start + 1000))]
                self.module.effect.batch_defer(*batch)
        started = time.time()
        env = procs.bench_env(JOBGUARD_BENCH_URL=self.db.url)
        running = procs.start(self._command(concurrency), workers, env, self.log)
        try:
            procs.wait_for(lambda: self.db.count() >= jobs, 600, f"{self.name} to drain")
            cpu = procs.drain_cpu([p.pid for p in running], self.db.url)
        finally:
            procs.stop(running)
        effects = self.db.effects()
        return effects, effects.last_done - started, cpu

    def pickup(
        self, workers: int, concurrency: int, rate: int, seconds: float, idle_s: float
    ) -> tuple[Effects, Sent, list[float]]:
        """Idle CPU of each process, then jobs paced one at a time; the rows they wrote."""
        self._clear()
        env = procs.bench_env(JOBGUARD_BENCH_URL=self.db.url)
        running = procs.start(self._command(concurrency), workers, env, self.log)
        try:
            time.sleep(2.0)
            cpu = procs.idle_cpu_percent([p.pid for p in running], idle_s)
            with self.module.app.open():
                sent = pace(lambda n: self.module.effect.defer(n=n, t=time.time()), rate, seconds)
            count = len(sent.called)
            procs.wait_for(lambda: self.db.count() >= count, 60, f"{self.name} paced jobs")
        finally:
            procs.stop(running)
        return self.db.effects(), sent, cpu


class Dramatiq:
    """dramatiq's own command: ``--processes`` x ``--threads``, Redis broker."""

    name = "dramatiq"
    store = "Redis"

    def __init__(self, db: PeerDatabase, folder: Path, redis_url: str) -> None:
        self.db = db
        self.log = folder / "dramatiq.log"
        self.redis_url = redis_url
        self.redis = redis.Redis.from_url(redis_url)
        foreign = [
            key for key in self.redis.scan_iter(count=1000) if not key.startswith(b"dramatiq")
        ]
        if foreign:
            raise SystemExit(
                f"{redis_url} holds keys that are not dramatiq's ({foreign[0]!r}); "
                "give the bench a free Redis database with --redis"
            )
        os.environ["JOBGUARD_BENCH_REDIS"] = redis_url
        self.module = load("bench.peer_dramatiq", db.url)

    def _command(self, workers: int, threads: int) -> list[str]:
        return [
            sys.executable,
            "-m",
            "dramatiq",
            "bench.peer_dramatiq",
            "--processes",
            str(workers),
            "--threads",
            str(threads),
            "--skip-logging",
        ]

    def _env(self) -> dict[str, str]:
        return procs.bench_env(JOBGUARD_BENCH_URL=self.db.url, JOBGUARD_BENCH_REDIS=self.redis_url)

    def clear(self) -> None:
        """Empty the effect table and this bench's Redis database (only that one)."""
        self.db.reset()
        self.redis.flushdb()

    def drain(self, jobs: int, workers: int, threads: int) -> tuple[Effects, float, Cpu]:
        """Prefill ``jobs``, drain them; the rows, the wall time from process start, the CPU."""
        self.clear()
        now = time.time()
        for n in range(jobs):
            self.module.effect.send(n=n, t=now)
        server = procs.redis_server_pid()
        broker_before = procs.cpu_seconds(server) if server else None
        started = time.time()
        master = procs.start(self._command(workers, threads), 1, self._env(), self.log)
        try:
            procs.wait_for(lambda: self.db.count() >= jobs, 600, f"{self.name} to drain")
            cpu = procs.drain_cpu([master[0].pid], self.db.url, broker_before)
        finally:
            procs.stop(master)
        effects = self.db.effects()
        return effects, effects.last_done - started, cpu

    def pickup(
        self, workers: int, threads: int, rate: int, seconds: float, idle_s: float
    ) -> tuple[Effects, Sent, list[float]]:
        """Idle CPU of each worker process, then jobs paced one at a time."""
        self.clear()
        master = procs.start(self._command(workers, threads), 1, self._env(), self.log)
        try:
            time.sleep(3.0)
            cpu = procs.idle_cpu_percent(procs.children(master[0].pid), idle_s)
            sent = pace(lambda n: self.module.effect.send(n=n, t=time.time()), rate, seconds)
            count = len(sent.called)
            procs.wait_for(lambda: self.db.count() >= count, 60, f"{self.name} paced jobs")
            effects = self.db.effects()
        finally:
            procs.stop(master)
            self.redis.flushdb()
        return effects, sent, cpu
