"""jobguard's side of the comparison: drains and paced pickups through ``jobguard worker``."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from bench import procs
from bench.measure import EFFECT_ROWS, Cpu, Effects, Sent, load, pace, read_effects
from bench.stores import BenchStore

QUEUE_OF = {"plain": "plain", "full": "full", "writes": "writes", "retry": "retry"}


@dataclass
class Drained:
    """One drain: attempt-log span, and for the full guard the business rows."""

    jobs: int
    attempt_span_s: float
    wall_s: float
    effects: Effects | None
    cpu: Cpu


@dataclass
class Paced:
    """One paced run: the enqueues, first deliveries, the rows (full guard), idle CPU."""

    sent: Sent
    leased: dict[int, float]
    effects: Effects | None
    idle_cpu: list[float]


class JobguardRuns:
    """Runs on one backend (``postgres`` or ``sqlite``), each in a fresh store."""

    def __init__(self, kind: str, database_url: str | None, folder: Path) -> None:
        self.kind = kind
        self.database_url = database_url
        self.folder = folder
        self.log = folder / f"jobguard-{kind}.log"

    def _store(self, label: str) -> BenchStore:
        return BenchStore(self.kind, self.database_url, self.folder, label)

    def _effects(self, store: BenchStore) -> Effects:
        return read_effects(store.rows(EFFECT_ROWS))

    def drain(self, mode: str, jobs: int, workers: int, concurrency: int) -> Drained:
        """Prefill ``jobs`` jobs, start the workers, stop them once every job completed."""
        store = self._store(f"drain_{mode}_{concurrency}")
        module = load("bench.apps", store.url)
        now = time.time()
        for start in range(0, jobs, 1000):
            numbers = range(start, min(jobs, start + 1000))
            if mode == "plain":
                module.noop.enqueue_many({"n": n} for n in numbers)
            elif mode == "retry":
                module.full_retry.enqueue_many({"n": n, "t": now} for n in numbers)
            elif mode == "writes":
                module.full_writes.enqueue_many({"n": n, "t": now} for n in numbers)
            else:
                module.full.enqueue_many({"n": n, "t": now} for n in numbers)
        module.app.close()
        started = time.time()
        env = procs.bench_env(JOBGUARD_BENCH_URL=store.url)
        command = procs.jobguard_command(QUEUE_OF[mode], concurrency, burst=False)
        running = procs.start(command, workers, env, self.log)
        try:
            procs.wait_for(lambda: store.completed() >= jobs, 600, "the drain")
            database = store.database_url if self.kind == "postgres" else None
            cpu = procs.drain_cpu([p.pid for p in running], database)
        finally:
            procs.stop(running)
        done = store.completed()
        if done != jobs:
            raise SystemExit(f"jobguard {self.kind} {mode}: only {done} of {jobs} jobs completed")
        effects = None
        if mode in ("full", "writes", "retry"):
            effects = self._effects(store)
            if effects.rows != jobs or effects.distinct != jobs:
                raise SystemExit(f"{effects.rows} business rows ({effects.distinct} distinct)")
        ended = float(store.scalar("SELECT max(ended_at) FROM attempts"))
        return Drained(jobs, store.attempt_span(), ended - started, effects, cpu)

    def pickup(
        self,
        mode: str,
        workers: int,
        concurrency: int,
        rate: int,
        seconds: float,
        idle_s: float,
    ) -> Paced:
        """Idle workers: CPU over ``idle_s``, then one job at a time at ``rate`` per second."""
        store = self._store(f"pickup_{mode}_{concurrency}")
        module = load("bench.apps", store.url)
        env = procs.bench_env(JOBGUARD_BENCH_URL=store.url)
        command = procs.jobguard_command(QUEUE_OF[mode], concurrency, burst=False)
        running = procs.start(command, workers, env, self.log)
        try:
            time.sleep(2.0)  # start-up: imports, connections, the first idle wait
            cpu = procs.idle_cpu_percent([p.pid for p in running], idle_s)
            if mode == "plain":
                sent = pace(lambda n: module.noop.enqueue(n=n), rate, seconds)
            else:
                task = module.full_writes if mode == "writes" else module.full
                sent = pace(lambda n: task.enqueue(n=n, t=time.time()), rate, seconds)
            count = len(sent.called)
            procs.wait_for(lambda: store.completed() >= count, 60, "paced jobs to complete")
        finally:
            procs.stop(running)
            module.app.close()
        effects = self._effects(store) if mode in ("full", "writes") else None
        return Paced(sent, store.leased(), effects, cpu)
