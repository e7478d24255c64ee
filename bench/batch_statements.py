"""jobguard's fetch and settle beside the floor bench's forms of them: the CPU each costs a job.

Usage (from the repository root, PostgreSQL on this host: its processes are read from
``/proc``)::

    python -m bench.batch_statements
    python -m bench.batch_statements --jobs 8000 --batch 16 --rounds 3

The floor bench (see docs/performance.md) fetches a batch with one statement that leases the
jobs, grants their locks, writes their attempt rows and claims their operations, and finishes a
batch with one statement that releases the locks, completes the operations, closes the attempts
and marks the jobs done, on tables of its own with the columns and indexes those statements
need and no more. Its two statements and their tables are copied here (schema ``floor``), beside
a jobguard schema migrated as a worker's store is. In one throw-away database, each round
queues ``--jobs`` jobs on each side (each job its own resource and operation, as the floor
bench's and jobguard's ``full`` job have), then, one side after the other (the order turned
each round): fetches them all ``--batch`` at a time (jobguard: the store's real
``fetch_prepared``), then settles them all as successes ``--batch`` at a time (jobguard: the
store's ``settle``, which writes ``settle_set``). Printed per job and statement, the median over
``--rounds``: this process's CPU (the client: its Python, psycopg and the system calls) and the
CPU of the database's server processes, in microseconds. The output is also written to
``bench/results/batch-statements-DATE.txt``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from bench import procs
from bench.compare import RESULTS, Tee, measured_on_scratch
from bench.fetch_history import own_cpu_s
from bench.measure import load
from bench.stores import BenchStore
from jobguard.backends.base import Closing, Ending
from jobguard.models import Guard, Outcome

QUEUE = "full"

# The floor bench's tables and statements (variant C), in a schema of their own.
FLOOR_SCHEMA = """
DROP SCHEMA IF EXISTS floor CASCADE;
CREATE SCHEMA floor;
CREATE TABLE floor.jobs (id bigserial PRIMARY KEY, queue text NOT NULL,
  priority int NOT NULL DEFAULT 0, run_at timestamptz NOT NULL DEFAULT now(),
  state text NOT NULL DEFAULT 'queued' CHECK (state IN ('queued', 'leased', 'done')),
  op_key text NOT NULL, resource text NOT NULL, args jsonb NOT NULL DEFAULT '{}',
  attempts int NOT NULL DEFAULT 0, lease_owner text, lease_until timestamptz,
  finished_at timestamptz);
CREATE INDEX jobs_ready ON floor.jobs (queue, priority DESC, run_at, id) WHERE state = 'queued';
CREATE INDEX jobs_leased ON floor.jobs (lease_until) WHERE state = 'leased';
CREATE TABLE floor.attempts (id bigserial PRIMARY KEY, job_id bigint NOT NULL, n int NOT NULL,
  worker text NOT NULL, fence bigint NOT NULL, started_at timestamptz NOT NULL DEFAULT now(),
  finished_at timestamptz, outcome text, UNIQUE (job_id, n));
CREATE TABLE floor.locks (resource text PRIMARY KEY, fence bigint NOT NULL DEFAULT 0,
  holder bigint, lease_until timestamptz);
CREATE TABLE floor.operations (op_key text PRIMARY KEY, job_id bigint NOT NULL,
  fence bigint NOT NULL, state text NOT NULL CHECK (state IN ('processing', 'completed')),
  result jsonb, updated_at timestamptz NOT NULL DEFAULT now());
"""
FLOOR_FETCH = """WITH c AS (SELECT id, op_key, resource FROM floor.jobs
  WHERE queue = %(q)s AND state = 'queued' AND run_at <= now()
  ORDER BY priority DESC, run_at, id LIMIT %(n)s FOR UPDATE SKIP LOCKED),
g AS (INSERT INTO floor.locks AS l (resource, fence, holder, lease_until)
      SELECT DISTINCT ON (resource) resource, 1, id, now() + interval '30 seconds' FROM c
      ORDER BY resource, id
      ON CONFLICT (resource) DO UPDATE SET fence = l.fence + 1, holder = EXCLUDED.holder,
        lease_until = EXCLUDED.lease_until WHERE l.holder IS NULL OR l.lease_until < now()
      RETURNING resource, fence, holder),
j AS (UPDATE floor.jobs SET state = 'leased', attempts = attempts + 1, lease_owner = %(w)s,
        lease_until = now() + interval '30 seconds' FROM g WHERE jobs.id = g.holder
      RETURNING jobs.id, jobs.op_key, jobs.attempts, g.resource, g.fence),
a AS (INSERT INTO floor.attempts (job_id, n, worker, fence)
      SELECT id, attempts, %(w)s, fence FROM j RETURNING id, job_id),
op AS (INSERT INTO floor.operations AS o (op_key, job_id, fence, state)
       SELECT op_key, id, fence, 'processing' FROM j
       ON CONFLICT (op_key) DO UPDATE SET job_id = EXCLUDED.job_id, fence = EXCLUDED.fence,
         updated_at = now() WHERE o.state <> 'completed')
SELECT j.id, j.op_key, j.resource, j.fence, a.id FROM j JOIN a ON a.job_id = j.id"""
FLOOR_FINISH = """WITH u AS (SELECT * FROM unnest(%(job)s::bigint[], %(op)s::text[],
    %(res)s::text[], %(fence)s::bigint[], %(att)s::bigint[]) AS u(job, op, res, fence, att)),
l AS (UPDATE floor.locks SET holder = NULL, lease_until = NULL FROM u
      WHERE locks.resource = u.res AND locks.fence = u.fence),
o AS (UPDATE floor.operations SET state = 'completed', result = %(result)s,
        updated_at = now() FROM u WHERE operations.op_key = u.op),
a AS (UPDATE floor.attempts SET finished_at = now(), outcome = 'ok' FROM u
      WHERE attempts.id = u.att)
UPDATE floor.jobs SET state = 'done', finished_at = now(), lease_owner = NULL,
  lease_until = NULL FROM u WHERE jobs.id = u.job"""
FLOOR_RESULT = Jsonb({"charged": 1})
ROWS = ("fetch", "settle")


class Timed:
    """Client and server CPU of the phases run through :meth:`run`, per job, in us."""

    def __init__(self, backends: Callable[[], list[int]]) -> None:
        self._backends = backends
        self.figures: dict[str, list[tuple[float, float]]] = {}

    def run(self, name: str, jobs: int, phase: Callable[[], None]) -> None:
        """Run ``phase`` (``jobs`` jobs' worth) and note what it cost."""
        pids = self._backends()
        client0, server0 = own_cpu_s(), procs.total_cpu_s(pids)
        phase()
        client, server = own_cpu_s() - client0, procs.total_cpu_s(pids) - server0
        self.figures.setdefault(name, []).append((1e6 * client / jobs, 1e6 * server / jobs))


def jobguard_round(module: Any, timed: Timed, args: argparse.Namespace, start: int) -> None:
    """Queue, fetch and settle ``--jobs`` of jobguard's ``full`` job, numbered from ``start``
    (each its own operation)."""
    app = module.app
    rules = {name: task.delivery_rules() for name, task in app.tasks.items()}
    for first in range(0, args.jobs, 1000):
        count = min(1000, args.jobs - first)
        module.full.enqueue_many({"n": start + first + n, "t": 0} for n in range(count))
    prepared: list[Any] = []

    def fetch() -> None:
        while len(prepared) < args.jobs:
            found = app.backend.fetch_prepared([QUEUE], args.batch, "bench-batch", rules)
            if not found:
                raise SystemExit(f"jobguard's queue ran dry after {len(prepared)} jobs")
            prepared.extend(found)

    timed.run("jobguard fetch", args.jobs, fetch)
    endings = []
    for item in prepared:
        delivery, begun = item.delivery, item.begun
        guard = Guard(
            job_id=delivery.job_id,
            lease_token=delivery.lease_token,
            attempt_id=delivery.attempt_id,
            lock=begun.grant if begun else None,
        )
        endings.append(
            Ending(
                guard,
                Closing(0.01, steps_run=1),
                Outcome.COMPLETED,
                operation_key=delivery.operation_key,
                result_json='{"charged": 1}',
            )
        )

    def settle() -> None:
        for first in range(0, len(endings), args.batch):
            refused = app.backend.settle(endings[first : first + args.batch])
            if any(refused):
                raise SystemExit(f"jobguard's settle refused: {refused}")

    timed.run("jobguard settle", args.jobs, settle)


def floor_round(conn: psycopg.Connection[Any], timed: Timed, args: argparse.Namespace) -> None:
    """Queue, fetch and finish ``--jobs`` of the floor bench's jobs."""
    start = conn.execute("SELECT coalesce(max(id), 0) FROM floor.jobs").fetchone()
    base = start[0] if start else 0
    conn.execute(
        "INSERT INTO floor.jobs (queue, op_key, resource, args, run_at) SELECT 'bench', "
        "'op:' || g, 'res:op:' || g, '{\"amount\": 1}', now() - interval '1 minute' "
        "FROM generate_series(%s::bigint, %s::bigint) g",
        (base + 1, base + args.jobs),
    )
    cursor = conn.cursor()
    batches: list[list[Any]] = []

    def fetch() -> None:
        taken = 0
        while taken < args.jobs:
            params = {"q": "bench", "n": args.batch, "w": "bench-batch"}
            rows = cursor.execute(FLOOR_FETCH, params, prepare=True).fetchall()
            if not rows:
                raise SystemExit(f"the floor's queue ran dry after {taken} jobs")
            batches.append(rows)
            taken += len(rows)

    def finish() -> None:
        for rows in batches:
            names = ("job", "op", "res", "fence", "att")
            columns = dict(zip(names, map(list, zip(*rows, strict=True)), strict=True))
            cursor.execute(FLOOR_FINISH, {**columns, "result": FLOOR_RESULT}, prepare=True)

    timed.run("floor fetch", args.jobs, fetch)
    timed.run("floor settle", args.jobs, finish)


def measure(database_url: str, args: argparse.Namespace, say: Tee) -> None:
    """Take turns, then print the medians."""
    store = BenchStore("postgres", database_url, Path("."), "batch")  # no files: PostgreSQL
    module = load("bench.apps", store.url)
    try:
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(FLOOR_SCHEMA)
            module.app.migrate()
            timed = Timed(partial(procs.database_backends, database_url))
            for round_number in range(args.rounds + 1):  # the first warms both up
                sides: list[Callable[[], None]] = [
                    partial(jobguard_round, module, timed, args, round_number * args.jobs),
                    partial(floor_round, conn, timed, args),
                ]
                for side in sides[round_number % 2 :] + sides[: round_number % 2]:
                    side()
                if round_number == 0:
                    timed.figures.clear()
        say(f"{args.jobs:,} jobs a round, batches of {args.batch}; median of {args.rounds} rounds")
        say(f"{'':16} {'client us/job':>14} {'server us/job':>14}")
        for name, figures in sorted(timed.figures.items()):
            client = statistics.median(value[0] for value in figures)
            server = statistics.median(value[1] for value in figures)
            say(f"{name:16} {client:14.1f} {server:14.1f}")
    finally:
        module.app.close()


def main() -> None:
    """Measure, print."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--jobs", type=int, default=4000, help="jobs a round on each side")
    parser.add_argument("--batch", type=int, default=16, help="jobs a fetch and a settle")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each side")
    parser.add_argument("--out", type=Path, default=None, help="results file")
    args = parser.parse_args()
    if args.jobs < args.batch or args.batch < 1 or args.rounds < 1:
        parser.error("--jobs must be at least --batch, --batch and --rounds at least 1")
    out = args.out or RESULTS / f"batch-statements-{dt.date.today().isoformat()}.txt"
    measured_on_scratch(
        out, "bench.batch_statements", "batch statements", lambda url, say: measure(url, args, say)
    )


if __name__ == "__main__":
    main()
