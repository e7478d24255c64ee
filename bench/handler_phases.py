"""Where a worker's CPU goes for one ``ctx.db_writes`` job on PostgreSQL, phase by phase.

Usage (from the repository root, PostgreSQL on 127.0.0.1:5432)::

    python -m bench.handler_phases --jobs 4000 --rounds 3

One thread does, in turn, what a worker's threads do for the ``writes`` jobs of the drains
(``bench.apps.full_writes``: lease, lock, claim, one ``db_writes`` step with the business
row, the batched success): ``fetch_prepared`` in batches of 16, ``Pipeline.run`` of each
delivery, one ``settle`` of the batch, the hooks told; nothing else runs, so no thread waits
for the GIL. Each phase's CPU is that thread's own (``time.thread_time``), per job. Within
``Pipeline.run``: the store's ``db_writes`` and, within that, its round trip
(``OneTrip.run``: the values dumped, the statements sent, every reply read); within the fetch
and the settle, their one statement each (psycopg's execute and the rows read, before jobguard
turns them into deliveries or refusals).

Beside it, ``bare psycopg``: the same two statements' shapes (a 12-value INSERT prepared, the
4-value business INSERT) in one psycopg pipeline on a plain connection, with no proof to
satisfy: what psycopg's own pipeline costs a step sent at once. The two take turns,
``--rounds`` times, each jobguard round on a fresh schema. The output is also written to
``bench/results/handler-phases-DATE.txt``.
"""

from __future__ import annotations

import argparse
import collections
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import psycopg

from bench.compare import results_run
from bench.measure import load, median_line
from bench.pgdb import INSERT_EFFECT_PG
from bench.stores import BenchStore
from jobguard.backends.postgres.onetrip import OneTrip
from jobguard.pipeline import Pipeline

BATCH = 16
PHASES = (
    "fetch_prepared",
    "  of which its statement (lease_and_begin)",
    "adopt",
    "Pipeline.run",
    "  of which the store's db_writes",
    "    of which its round trip (OneTrip.run)",
    "settle",
    "  of which its statement (settle_set)",
    "hooks told",
)
FETCH, FETCH_STATEMENT, ADOPT, RUN, DB_WRITES, ROUND_TRIP, SETTLE, SETTLE_STATEMENT, HOOKS = PHASES
STATEMENT_OF = {"lease_and_begin": FETCH_STATEMENT, "settle_set": SETTLE_STATEMENT}
BARE = "bare psycopg: the same step in one psycopg pipeline"
BARE_RECORD = (
    b"INSERT INTO bare_steps (key, name, result, fence, created_at) VALUES "
    b"($1, $2, $3, $4, CASE WHEN $5::bigint IS NOT NULL AND $6::text IS NOT NULL "
    b"AND $7::text IS NULL AND $8::text IS NULL AND $9::int IS NULL AND $10::bigint IS NULL "
    b"AND $11::bigint IS NOT NULL THEN $12::float8 END)"
)


def timed(spent: collections.defaultdict[str, float], label: str, fn: Callable[..., Any]) -> Any:
    """``fn`` with its thread CPU added to ``spent[label]`` at each call."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[label] += time.thread_time() - started

    return wrapper


@contextmanager
def round_trips_timed(spent: collections.defaultdict[str, float], label: str) -> Iterator[None]:
    """Count the thread CPU of every ``OneTrip.run`` (a db_writes step's round trip)."""
    original = OneTrip.run
    OneTrip.run = timed(spent, label, original)  # type: ignore[method-assign]
    try:
        yield
    finally:
        OneTrip.run = original  # type: ignore[method-assign]


def jobguard_round(database_url: str, folder: Path, jobs: int) -> dict[str, float]:
    """One drain of ``jobs`` writes jobs by one thread: CPU per job of each phase, in us."""
    store = BenchStore("postgres", database_url, folder, "phases")
    module = load("bench.apps", store.url)
    now = time.time()
    for start in range(0, jobs, 1000):
        numbers = range(start, min(jobs, start + 1000))
        module.full_writes.enqueue_many({"n": n, "t": now} for n in numbers)
    app = module.app
    backend = app.backend
    rules = {name: task.delivery_rules() for name, task in app.tasks.items()}
    pipeline = Pipeline(backend, app.tasks, "bench-phases", app.hooks)
    spent: collections.defaultdict[str, float] = collections.defaultdict(float)
    backend.db_writes = timed(spent, DB_WRITES, backend.db_writes)
    driver = backend.driver
    write_statement = driver.write_statement

    def statement_timed(name: str, params: Any) -> Any:
        return timed(spent, STATEMENT_OF.get(name, name), write_statement)(name, params)

    driver.write_statement = statement_timed
    done = 0
    clock = time.thread_time
    with backend.keep_connection(), round_trips_timed(spent, ROUND_TRIP):
        while True:
            t0 = clock()
            prepared = backend.fetch_prepared(["writes"], BATCH, "bench-phases", rules)
            t1 = clock()
            if not prepared:
                break
            inflights = [pipeline.adopt(each) for each in prepared]
            t2 = clock()
            endings = [pipeline.run(inflight) for inflight in inflights]
            t3 = clock()
            backend.settle(endings)
            t4 = clock()
            for inflight, ending in zip(inflights, endings, strict=True):
                pipeline.report(inflight, ending)
            t5 = clock()
            for label, began, ended in zip(
                (FETCH, ADOPT, RUN, SETTLE, HOOKS),
                (t0, t1, t2, t3, t4),
                (t1, t2, t3, t4, t5),
                strict=True,
            ):
                spent[label] += ended - began
            done += len(prepared)
    app.close()
    if done != jobs:
        raise SystemExit(f"only {done} of {jobs} jobs were fetched")
    return {label: 1e6 * spent[label] / jobs for label in PHASES}


def bare_round(database_url: str, jobs: int) -> float:
    """The same step's two statements, ``jobs`` times, each in one pipeline: CPU per job, us."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS bare_steps")
        conn.execute(
            "CREATE TABLE bare_steps (key text PRIMARY KEY, name text, result jsonb, "
            "fence bigint, created_at double precision NOT NULL)"
        )
        record, effect = psycopg.RawCursor(conn), conn.cursor()
        now = time.time()
        started = time.thread_time()
        for n in range(jobs):
            values = [f"bench-writes:{n}", "effect", "null", 1, n, "token", None]
            values += [None, None, None, 1, now]
            with conn.pipeline():
                record.execute(BARE_RECORD, values, prepare=True)
                effect.execute(INSERT_EFFECT_PG, (n, now, now, now))
        return 1e6 * (time.thread_time() - started) / jobs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=4000, help="jobs per round")
    parser.add_argument("--rounds", type=int, default=3, help="times each side runs")
    args = parser.parse_args()
    command = f"python -m bench.handler_phases --jobs {args.jobs} --rounds {args.rounds}"
    found: dict[str, list[float]] = {label: [] for label in (*PHASES, BARE)}
    with results_run("handler-phases", command) as (say, url), TemporaryDirectory() as folder:
        for _ in range(args.rounds):
            for label, us in jobguard_round(url, Path(folder), args.jobs).items():
                found[label].append(us)
            found[BARE].append(bare_round(url, args.jobs))
        say(f"one thread, batches of {BATCH}; thread CPU per job in us: median (each round)")
        for label, values in found.items():
            say(median_line(label, values, 45))


if __name__ == "__main__":
    main()
