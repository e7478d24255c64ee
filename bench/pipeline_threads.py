"""What psycopg's pipeline mode costs a threaded worker: one step-shaped transaction, six ways.

Usage (from the repository root, PostgreSQL on 127.0.0.1:5432)::

    python -m bench.pipeline_threads                       # 1 thread, then 2 processes x 8
    python -m bench.pipeline_threads --shapes 1x1,2x16 --transactions 1500
    python -m bench.pipeline_threads --shapes 1x1,2x16 --ways all,onetrip

Each transaction has the shape of a ``ctx.db_step`` on PostgreSQL: BEGIN, a read that proves
the guard, the job's own INSERT, a read standing for the step record's fenced insert, COMMIT.
It is sent six ways, each thread on its own autocommit connection of a throw-away database:

* ``separate``: every statement its own round trip (5), as jobguard's ``db_step`` sends them;
* ``ends``: BEGIN with the proof, and the last read with COMMIT, each pair in one psycopg
  pipeline (3 round trips: the user's statements in the middle are not pipelined, so that
  their errors are raised where they are executed);
* ``two``: BEGIN with the proof, then the rest in a second pipeline (2 round trips);
* ``all``: the whole transaction in one psycopg pipeline (1 round trip), as the floor bench
  sends it;
* ``onetrip``: the same statements in libpq's pipeline mode below psycopg's cursors, one flush
  and one wait (:mod:`jobguard.backends.postgres.onetrip`), as ``ctx.db_writes`` sends a step;
* ``text``: the whole transaction as one text, the values bound on the client (1 round trip, one
  write and one wait, where a pipeline waits for its socket once per statement).

For each shape (``PROCESSESxTHREADS``) and way: transactions per second, the client processes'
CPU per transaction (user + system, all threads) and the CPU of their server backends (from
``/proc``, so the server must run on this host). The ways run in turn, twice, so drift shows.
The output is also written to ``bench/results/pipeline-threads-DATE.txt``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import multiprocessing as mp
import os
import resource
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import psycopg
from psycopg import sql

from bench.compare import RESULTS, Tee
from bench.pgdb import scratch_database
from bench.procs import cpu_seconds
from jobguard.backends.postgres.onetrip import Call, OneTrip, caller_call

PROOF = "SELECT %s::bigint AS lease_ok"
EFFECT = "INSERT INTO bench_tx (v) VALUES (%s)"
STEP = "SELECT %s::bigint AS step_ok"


def separate(conn: psycopg.Connection[Any], cur: psycopg.Cursor[Any], n: int) -> None:
    """Five round trips: BEGIN, proof, effect, step, COMMIT."""
    with conn.transaction():
        cur.execute(PROOF, (n,)).fetchall()
        cur.execute(EFFECT, (n,))
        cur.execute(STEP, (n,)).fetchall()


def ends(conn: psycopg.Connection[Any], cur: psycopg.Cursor[Any], n: int) -> None:
    """Three round trips: [BEGIN, proof], effect, [step, COMMIT]."""
    with conn.pipeline():
        cur.execute("BEGIN")
        cur.execute(PROOF, (n,))
    cur.fetchall()
    cur.execute(EFFECT, (n,))
    with conn.pipeline():
        cur.execute(STEP, (n,))
        cur.execute("COMMIT")


def two(conn: psycopg.Connection[Any], cur: psycopg.Cursor[Any], n: int) -> None:
    """Two round trips: [BEGIN, proof], then [effect, step, COMMIT]."""
    with conn.pipeline():
        cur.execute("BEGIN")
        cur.execute(PROOF, (n,))
    cur.fetchall()
    with conn.pipeline():
        cur.execute(EFFECT, (n,))
        cur.execute(STEP, (n,))
        cur.execute("COMMIT")


def whole(conn: psycopg.Connection[Any], cur: psycopg.Cursor[Any], n: int) -> None:
    """One round trip: the five statements in one pipeline."""
    with conn.pipeline():
        cur.execute("BEGIN")
        cur.execute(PROOF, (n,))
        cur.execute(EFFECT, (n,))
        cur.execute(STEP, (n,))
        cur.execute("COMMIT")


def text(conn: psycopg.Connection[Any], cur: psycopg.Cursor[Any], n: int) -> None:
    """One round trip, one query: the five statements as one text with the value bound on the
    client (the simple query protocol): psycopg sends it at once and waits once, where a
    pipeline waits for the socket once per statement it queues. jobguard does not send a
    step this way: a text of several statements is what keeps a step's own statements from
    ending its transaction, and a plan is made at every run."""
    value = sql.Literal(n)
    cur.execute(
        sql.SQL("BEGIN; {}; {}; {}; COMMIT").format(
            sql.SQL(PROOF.replace("%s", "{}")).format(value),
            sql.SQL(EFFECT.replace("%s", "{}")).format(value),
            sql.SQL(STEP.replace("%s", "{}")).format(value),
        )
    )


_TRIPS: dict[int, OneTrip] = {}


def one_trip(conn: psycopg.Connection[Any], cur: psycopg.Cursor[Any], n: int) -> None:
    """One round trip: the five statements sent by jobguard's OneTrip (each connection keeps
    its own, with the statements it prepared)."""
    trip = _TRIPS.get(id(conn))
    if trip is None:
        trip = _TRIPS[id(conn)] = OneTrip(conn)
    trip.run(
        [
            Call(b"BEGIN"),
            caller_call(conn, PROOF, (n,)),
            caller_call(conn, EFFECT, (n,)),
            caller_call(conn, STEP, (n,)),
            Call(b"COMMIT"),
        ]
    )


WAYS: dict[str, Callable[[psycopg.Connection[Any], psycopg.Cursor[Any], int], None]] = {
    "separate": separate,
    "ends": ends,
    "two": two,
    "all": whole,
    "text": text,
    "onetrip": one_trip,
}


def client(url: str, way: str, threads: int, count: int, out: Any) -> None:
    """One client process: ``threads`` connections, ``count`` transactions on each."""
    conns = [psycopg.connect(url, autocommit=True) for _ in range(threads)]
    backends = [conn.info.backend_pid for conn in conns]
    send = WAYS[way]

    def loop(conn: psycopg.Connection[Any]) -> None:
        cur = conn.cursor()
        for n in range(count):
            send(conn, cur, n)

    for conn in conns:  # warm: psycopg prepares a statement on its fifth run
        loop_cur = conn.cursor()
        for n in range(10):
            send(conn, loop_cur, n)
    server0 = sum(cpu_seconds(pid) for pid in backends)
    own0 = resource.getrusage(resource.RUSAGE_SELF)
    started = time.perf_counter()
    running = [threading.Thread(target=loop, args=(conn,)) for conn in conns]
    for thread in running:
        thread.start()
    for thread in running:
        thread.join()
    wall = time.perf_counter() - started
    own1 = resource.getrusage(resource.RUSAGE_SELF)
    server1 = sum(cpu_seconds(pid) for pid in backends)
    cpu = own1.ru_utime + own1.ru_stime - own0.ru_utime - own0.ru_stime
    out.put((wall, cpu, server1 - server0))
    for conn in conns:
        conn.close()


def measure(url: str, way: str, processes: int, threads: int, count: int) -> str:
    """One run of one way at one shape, as a line."""
    context = mp.get_context("spawn")
    results = context.Queue()
    started = [
        context.Process(target=client, args=(url, way, threads, count, results))
        for _ in range(processes)
    ]
    for process in started:
        process.start()
    measured = [results.get(timeout=600) for _ in started]
    for process in started:
        process.join()
    total = processes * threads * count
    wall = max(m[0] for m in measured)
    client_us = 1e6 * sum(m[1] for m in measured) / total
    server_us = 1e6 * sum(m[2] for m in measured) / total
    return (
        f"{processes}x{threads:<3} {way:9} {total / wall:8.0f} tx/s  client CPU {client_us:5.0f} "
        f"us/tx  server CPU {server_us:5.0f} us/tx"
    )


def shape(text: str) -> tuple[int, int]:
    """``PROCESSESxTHREADS``, for example ``2x8``."""
    processes, _, threads = text.partition("x")
    if not (processes.isdigit() and threads.isdigit()) or min(int(processes), int(threads)) < 1:
        raise argparse.ArgumentTypeError(f"a shape is PROCESSESxTHREADS, not {text!r}")
    return int(processes), int(threads)


def main() -> None:
    """Run every way at every shape, twice in turn."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--shapes",
        type=lambda text: [shape(part) for part in text.split(",")],
        default=[(1, 1), (2, 8)],
        help="PROCESSESxTHREADS,... (default 1x1,2x8)",
    )
    parser.add_argument("--transactions", type=int, default=1500, help="per thread and run")
    parser.add_argument(
        "--ways",
        type=lambda text: text.split(","),
        default=list(WAYS),
        help=f"which ways, in turn (default all: {','.join(WAYS)})",
    )
    args = parser.parse_args()
    unknown = sorted(set(args.ways) - set(WAYS))
    if unknown:
        parser.error(f"--ways: no way named {', '.join(unknown)} (the ways: {', '.join(WAYS)})")
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"pipeline-threads-{dt.date.today().isoformat()}.txt"
    with path.open("a") as sink, scratch_database() as url:
        say = Tee(sink)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE TABLE bench_tx (id bigserial PRIMARY KEY, v bigint NOT NULL)")
            version = conn.execute("SHOW server_version").fetchone()
        say(
            f"$ python -m bench.pipeline_threads --shapes "
            f"{','.join(f'{p}x{t}' for p, t in args.shapes)} --transactions {args.transactions} "
            f"--ways {','.join(args.ways)}; "
            f"psycopg {psycopg.__version__} "
            f"({psycopg.pq.__impl__}), PostgreSQL {version[0] if version else '?'}, "
            f"{os.cpu_count()} cores, load average at start {os.getloadavg()[0]:.1f}"
        )
        run = partial(measure, url, count=args.transactions)
        for processes, threads in args.shapes:
            for _ in range(2):
                for way in args.ways:
                    say(run(way, processes, threads))
    print(f"written to {path}")


if __name__ == "__main__":
    main()
