"""The server's CPU for one ``db_writes`` step's transaction, by the form of its record.

Usage (from the repository root, PostgreSQL on this host: the server's process is read from
``/proc``)::

    python -m bench.step_server_cpu
    python -m bench.step_server_cpu --jobs 5000 --rounds 7 --before ../before

In a throw-away database migrated to jobguard's schema, ``--jobs`` running jobs, each holding
its resource's lock and its operation's claim, have one step each recorded per round, in the
transaction a ``db_writes`` step sends (one psycopg pipeline: the record, then the step's own
INSERT, committed at its one Sync), with the record in three forms, alternating:

- ``jobguard``: this checkout's ``insert_step_or_fail``, every proof a step's record makes (the
  lease, the lock's fence held FOR SHARE, the slot's fence, the operation's claim);
- ``fence only``: the floor bench's step record, its one proof the lock's fence held FOR SHARE;
- ``no proof``: the record inserted as it is;
- with ``--before CHECKOUT``, ``before``: that checkout's ``insert_step_or_fail``.

It prints the median, over ``--rounds`` rounds, of the CPU the server's process for the one
connection spent per transaction (``/proc/<pid>/stat``, in clock ticks: ``--jobs`` sets the
resolution), commit included. The forms take turns, the first of a round a different one each
round, so that neither the machine's drift nor the steps table's growth favours one.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import psycopg

from bench.measure import median_line
from bench.pgdb import scratch_database
from bench.procs import cpu_seconds
from jobguard.backends._sql import parse_queries
from jobguard.backends.postgres.driver import render_queries
from jobguard.backends.postgres.migrate import migrate_url

NOW = "extract(epoch FROM clock_timestamp())::float8"
FENCE_ONLY = (
    "INSERT INTO jobguard.steps (operation_key, name, result, fence, created_at) VALUES "
    "(%(key)s, %(name)s, %(result)s, (SELECT fence FROM jobguard.locks WHERE resource = "
    f"%(resource)s AND fence = %(fence)s FOR SHARE), {NOW})"
)
NO_PROOF = (
    "INSERT INTO jobguard.steps (operation_key, name, result, fence, created_at) VALUES "
    f"(%(key)s, %(name)s, %(result)s, %(fence)s, {NOW})"
)
EFFECT = "INSERT INTO step_effects (n, note) VALUES (%s, %s)"


def prepare(conn: psycopg.Connection[Any], jobs: int) -> list[int]:
    """``jobs`` running jobs, each holding its lock and its operation's claim; their ids."""
    conn.execute("CREATE TABLE step_effects (n integer NOT NULL, note text NOT NULL)")
    conn.execute(
        "INSERT INTO jobguard.jobs (task, queue, payload, status, available_at, run_at,"
        " max_attempts, visibility_timeout_s, lease_token, operation_key, resource_key,"
        " created_at) SELECT 'bench', 'bench', '{}', 'running', 1e10, 0, 3, 30, 'lease' || g,"
        " 'op' || g, 'res' || g, 0 FROM generate_series(1, %s) AS g",
        (jobs,),
    )
    conn.execute(
        "INSERT INTO jobguard.locks SELECT 'res' || g, 'owner' || g, 1, 1e10"
        " FROM generate_series(1, %s) AS g",
        (jobs,),
    )
    conn.execute(
        "INSERT INTO jobguard.operations (key, status, resource_key, owner_lease, attempts,"
        " fence, created_at, updated_at) SELECT 'op' || g, 'processing', 'res' || g,"
        " 'lease' || g, 1, 1, 0, 0 FROM generate_series(1, %s) AS g",
        (jobs,),
    )
    conn.execute("VACUUM ANALYZE")
    return [row[0] for row in conn.execute("SELECT id FROM jobguard.jobs ORDER BY id")]


def record_of(checkout: Path) -> str:
    """``checkout``'s ``insert_step_or_fail``, rendered as this checkout renders its own."""
    queries = checkout / "src" / "jobguard" / "backends" / "postgres" / "queries.sql"
    if not queries.is_file():
        raise SystemExit(f"--before {checkout}: not a jobguard checkout (no {queries.name})")
    return render_queries("jobguard", parse_queries(queries.read_text()))["insert_step_or_fail"]


def run_round(conn: psycopg.Connection[Any], record: str, ids: list[int], step: str) -> None:
    """A round of ``record``: one step's transaction for each job, named ``step``."""
    cursor = conn.cursor()
    for n, job_id in enumerate(ids, 1):
        params = {
            "key": f"op{n}",
            "name": step,
            "result": "null",
            "fence": 1,
            "now": None,
            "job_id": job_id,
            "lease_token": f"lease{n}",
            "resource": f"res{n}",
            "slot_key": None,
            "slot": None,
            "slot_fence": None,
        }
        with conn.pipeline():
            cursor.execute(record, params, prepare=True)
            cursor.execute(EFFECT, (n, step), prepare=True)


def main() -> None:
    """Print each form's median server CPU per transaction."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--jobs", type=int, default=3000, help="transactions a round")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of each form")
    parser.add_argument("--before", type=Path, help="also time this checkout's record")
    args = parser.parse_args()
    if args.jobs < 100 or args.rounds < 1:
        parser.error("--jobs must be at least 100 and --rounds at least 1")
    forms = {
        "jobguard": render_queries("jobguard")["insert_step_or_fail"],
        "fence only": FENCE_ONLY,
        "no proof": NO_PROOF,
    }
    if args.before is not None:
        forms["before"] = record_of(args.before.resolve())
    with scratch_database() as url:
        migrate_url(url)
        with psycopg.connect(url, autocommit=True) as conn:
            pid = conn.info.backend_pid
            if not Path(f"/proc/{pid}/stat").exists():
                raise SystemExit("the server's process is not on this host: run it beside it")
            ids = prepare(conn, args.jobs)
            per_tx: dict[str, list[float]] = {form: [] for form in forms}
            for round_number in range(args.rounds + 1):  # the first round warms up
                turn = round_number % len(forms)
                for form, record in [*forms.items()][turn:] + [*forms.items()][:turn]:
                    before = cpu_seconds(pid)
                    run_round(conn, record, ids, f"{form} {round_number}")
                    if round_number:
                        per_tx[form].append((cpu_seconds(pid) - before) / len(ids) * 1e6)
            recorded = conn.execute("SELECT count(*) FROM jobguard.steps").fetchone()
            expected = len(ids) * (args.rounds + 1) * len(forms)
            if recorded is None or recorded[0] != expected:
                raise SystemExit(f"recorded {recorded} steps, expected {expected}")
    print(f"server CPU per step transaction, us (median of {args.rounds} rounds of {args.jobs})")
    for form, values in per_tx.items():
        print(median_line(form, values, 11))


if __name__ == "__main__":
    main()
