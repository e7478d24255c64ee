"""jobguard on PostgreSQL and SQLite beside procrastinate and dramatiq, in one run.

Usage (from the repository root, after ``pip install -e '.[postgres,bench]'``; PostgreSQL on
127.0.0.1:5432 and, for dramatiq, Redis on 127.0.0.1:6379)::

    python -m bench.compare                       # 10,000 jobs per drain, about 6 minutes
    python -m bench.compare --jobs 5000 --no-peers

jobguard runs through the real ``jobguard worker`` command (2 processes, at 4 and at 16
threads) with three jobs: "plain", a no-op, "full", the whole guard (lease + resource lock +
operation record + one ``ctx.db_step`` inserting a business row into the store's own database +
atomic finish), and "writes", the same guard and row with the row written by ``ctx.db_writes``
(the step's transaction sent in one round trip on PostgreSQL). The peers run their own worker
commands (2 processes x 4 threads, or each
count of ``--peer-concurrency``) with a handler that inserts the same row into PostgreSQL; each
ratio compares jobguard's full guard with a peer of the same processes x threads (or, where the
peer did not run at that shape, with its first). For every system:

* drain: a prefilled queue is drained; jobs/s over the span from the first handler start to the
  last business row (plain jobs write no row: first delivery to last finish in the attempt log);
  wall time from the start of the worker processes; and the CPU the drain cost per job, read
  from /proc once every job is done: the worker processes (start-up included), the PostgreSQL
  server processes of their connections, and for dramatiq the Redis server (which serves
  anyone else using it at the time too). CPU per job does not depend on how busy the machine
  is, jobs/s does;
* pickup: idle workers' CPU (from /proc, % of one core per process) over a quiet period, then
  jobs enqueued one at a time at ``--rate`` per second; p50/p99 in ms from the return of the
  producer's enqueue call (the job is committed) to the job's first lease (jobguard's attempt
  log) and to its handler's start (the business row), all on this host's wall clock; the
  enqueue call's own duration is shown beside them.

Each run uses a throw-away PostgreSQL database and a dedicated Redis database (``--redis``,
flushed, refused if it holds anything but dramatiq's keys). The output is also written to
``bench/results/compare-DATE.txt``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import sqlite3
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from importlib.metadata import version
from pathlib import Path
from typing import TextIO, TypeVar

import psycopg

from bench.jobguard_runs import JobguardRuns
from bench.measure import Cpu, Effects, Sent
from bench.peers import DRAMATIQ_REDIS, Dramatiq, PeerDatabase, Procrastinate
from bench.pgdb import scratch_database, server_settings, server_started, wait_for_server
from jobguard.diagnostics.durations import percentile
from jobguard.exceptions import JobGuardError

T = TypeVar("T")
RESULTS = Path(__file__).resolve().parent / "results"


class Tee:
    """Print to stdout and to the results file."""

    def __init__(self, sink: TextIO) -> None:
        self.sink = sink

    def __call__(self, line: str = "") -> None:
        print(line, flush=True)
        self.sink.write(line + "\n")
        self.sink.flush()


@contextmanager
def results_run(name: str, command: str) -> Iterator[tuple[Tee, str]]:
    """A bench run on a throw-away PostgreSQL database: yields ``(say, url)``, where ``say``
    prints a line and appends it to ``bench/results/NAME-DATE.txt``, whose first line for the
    run is ``command`` with the machine's cores and load average."""
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}-{dt.date.today().isoformat()}.txt"
    with path.open("a") as sink, scratch_database() as url:
        say = Tee(sink)
        say(f"$ {command}; {os.cpu_count()} cores, load average at start {os.getloadavg()[0]:.1f}")
        yield say, url
    print(f"written to {path}")


@dataclass
class Line:
    """One row of the table."""

    system: str
    store: str
    shape: str
    job: str
    jobs_per_s: float
    wall_s: float
    lease_ms: list[float] | None
    handler_ms: list[float] | None
    call_ms: list[float]
    idle_cpu: list[float]
    cpu_ms: str


def p50_p99(delays: list[float] | None) -> str:
    """``p50 / p99`` in ms, or a dash."""
    if not delays:
        return "-"
    return f"{percentile(delays, 50):5.1f} / {percentile(delays, 99):5.1f}"


def render(line: Line) -> str:
    """One table row."""
    cpu = " ".join(f"{c:4.1f}" for c in line.idle_cpu)
    return (
        f"{line.system:22s} {line.store:10s} {line.shape:6s} {line.job:5s} "
        f"{line.jobs_per_s:8.0f} {line.wall_s:7.2f}  {p50_p99(line.lease_ms):>13s}  "
        f"{p50_p99(line.handler_ms):>13s}  {p50_p99(line.call_ms):>13s}  {cpu:9s}  "
        f"{line.cpu_ms}"
    )


HEADER = (
    f"{'system':22s} {'store':10s} {'shape':6s} {'job':5s} {'jobs/s':>8s} {'wall s':>7s}  "
    f"{'to lease ms':>13s}  {'to handler ms':>13s}  {'enqueue ms':>13s}  idle CPU%  "
    "drain CPU ms/job (workers + PostgreSQL [+ Redis])"
)


def say_postgres_bench(say: Tee, module: str, database_url: str) -> None:
    """The command line of a PostgreSQL bench and the machine it runs on, first in its output."""
    say(f"$ python -m {module} {' '.join(sys.argv[1:])}".rstrip())
    say(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}; {server_settings(database_url)}; load average at start "
        f"{os.getloadavg()[0]:.1f}"
    )


def measured_on_scratch(
    out: Path, module: str, what: str, measure: Callable[[str, Tee], None]
) -> None:
    """Run ``measure(database_url, say)`` on a throw-away database (again if PostgreSQL
    restarted meanwhile), its lines printed and appended to ``out`` after the command line and
    the machine's."""
    with out.open("a") as sink, scratch_database() as database_url:
        say = Tee(sink)
        say_postgres_bench(say, module, database_url)
        again(say, what, partial(measure, database_url, say))
        say()


def again(say: Tee, what: str, measure: Callable[[], T]) -> T:
    """Run one measurement; run it again if PostgreSQL restarted meanwhile.

    The server is shared with other work on the machine, which may restart it; a measurement
    it fell into is thrown away (and said so in the output), never mixed into the figures.
    """
    for attempt in range(3):
        wait_for_server()
        started = server_started()
        try:
            result = measure()
        except (psycopg.Error, JobGuardError, SystemExit) as exc:
            if attempt == 2:
                raise
            say(f"  ({what}: {str(exc).strip().splitlines()[-1][:90]}; measuring again)")
            continue
        if server_started() == started:
            return result
        say(f"  ({what}: PostgreSQL restarted during the measurement; measuring again)")
    raise SystemExit(f"{what}: PostgreSQL kept restarting")


def jobguard_lines(
    runs: JobguardRuns, args: argparse.Namespace, say: Tee, store: str
) -> list[Line]:
    """Every jobguard run on one backend."""
    found: list[Line] = []
    for concurrency in args.concurrency:
        for mode in ("plain", "full", "writes"):
            what = f"jobguard {store} {mode} 2x{concurrency}"
            drained = again(
                say, what, partial(runs.drain, mode, args.jobs, args.workers, concurrency)
            )
            pickup = partial(
                runs.pickup, mode, args.workers, concurrency, args.rate, args.seconds, args.idle_s
            )
            paced = again(say, what, pickup)
            rate = drained.jobs / drained.attempt_span_s
            effects = drained.effects
            if effects is not None:
                rate = effects.rows / effects.span_s
                say(
                    f"  (jobguard {store} {mode} c={concurrency}: attempt log first delivery to "
                    f"last finish {drained.jobs / drained.attempt_span_s:.0f} jobs/s)"
                )
            line = Line(
                "jobguard " + version("jobguard"),
                store,
                f"{args.workers}x{concurrency}",
                mode,
                rate,
                drained.wall_s,
                paced.sent.delay_ms(paced.leased),
                paced.sent.delay_ms(paced.effects.started) if paced.effects else None,
                paced.sent.call_ms(),
                paced.idle_cpu,
                drained.cpu.per_job_ms(drained.jobs),
            )
            say(render(line))
            found.append(line)
        storm = again(
            say,
            f"jobguard {store} retry 2x{concurrency}",
            partial(runs.drain, "retry", args.jobs, args.workers, concurrency),
        )
        if storm.effects is not None:
            say(
                f"  (jobguard {store} full c={concurrency}, a third of the jobs failing once and "
                f"retried: {storm.effects.rows / storm.effects.span_s:.0f} jobs/s, CPU "
                f"{storm.cpu.per_job_ms(storm.jobs)} ms per job)"
            )
    return found


def peer_line(
    name: str,
    store: str,
    shape: str,
    drained: tuple[Effects, float, Cpu],
    paced: tuple[Effects, Sent, list[float]],
) -> Line:
    """A peer's row."""
    effects, wall_s, used = drained
    rows, sent, cpu = paced
    return Line(
        f"{name} {version(name)}",
        store,
        shape,
        "row",
        effects.rows / effects.span_s,
        wall_s,
        None,
        sent.delay_ms(rows.started),
        sent.call_ms(),
        cpu,
        used.per_job_ms(effects.rows),
    )


def peers_beside(lines: list[Line], shape: str) -> list[tuple[str, Line]]:
    """Each peer's line at ``shape`` (processes x threads), or its first line if it did not run
    at that shape: ``(name, line)`` in the order the peers ran."""
    found: dict[str, Line] = {}
    for line in lines:
        name = line.system.split()[0]
        if name == "jobguard":
            continue
        if name not in found or (line.shape == shape and found[name].shape != shape):
            found[name] = line
    return list(found.items())


def verdicts(lines: list[Line], args: argparse.Namespace, say: Tee) -> None:
    """Ratios of jobguard's full guard (``db_step`` and ``db_writes``) on PostgreSQL to the
    peers, and the issue's targets."""
    guarded = [x for x in lines if x.system.startswith("jobguard") and x.job in ("full", "writes")]
    say()
    for line in guarded:
        for name, peer in peers_beside(lines, line.shape):
            say(
                f"ratio: jobguard {line.job} ({line.store}, {line.shape}) / {name} "
                f"({peer.shape}) = {line.jobs_per_s / peer.jobs_per_s:.2f}x"
            )
    targets = {"dramatiq": 2.0, "procrastinate": 7.0}
    say()
    for line in guarded:
        if line.store != "PostgreSQL":
            continue
        for name, peer in peers_beside(lines, line.shape):
            ratio = line.jobs_per_s / peer.jobs_per_s
            need = targets[name]
            verdict = "met" if ratio >= need else f"missed by {need / ratio:.2f}x"
            say(
                f"target {line.job} guard PostgreSQL {line.shape} >= {need:.0f}x {name}: "
                f"{ratio:.2f}x, {verdict}"
            )
    for line in lines:
        if not line.system.startswith("jobguard"):
            continue
        delays = line.handler_ms or line.lease_ms
        assert delays is not None
        what = "handler start" if line.handler_ms else "lease"
        p50, p99 = percentile(delays, 50), percentile(delays, 99)
        call = percentile(line.call_ms, 50)
        cpu = max(line.idle_cpu)
        ok = p50 <= 2.0 and p99 <= 5.0 and cpu < 1.0
        say(
            f"target pickup {line.store} {line.shape} {line.job}, enqueue return to {what}: "
            f"p50 {p50:.1f} ms (<= 2), p99 {p99:.1f} ms (<= 5), idle {cpu:.1f}% (< 1): "
            f"{'met' if ok else 'missed'}; from the enqueue call add its own {call:.1f} ms p50"
        )


def parse() -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000, help="jobs per drain")
    parser.add_argument("--workers", type=int, default=2, help="worker processes")
    parser.add_argument(
        "--concurrency",
        type=lambda text: [int(c) for c in text.split(",")],
        default=[4, 16],
        help="jobguard threads per process, comma-separated",
    )
    parser.add_argument(
        "--peer-concurrency",
        type=lambda text: [int(c) for c in text.split(",")],
        default=[4],
        help="peers' threads (dramatiq) or concurrency (procrastinate) per process, "
        "comma-separated",
    )
    parser.add_argument("--rate", type=int, default=25, help="pickup: jobs/s, one at a time")
    parser.add_argument("--seconds", type=float, default=10.0, help="pickup: pacing length")
    parser.add_argument("--idle-s", type=float, default=10.0, help="idle CPU measuring period")
    parser.add_argument("--backends", default="postgres,sqlite", help="jobguard backends")
    parser.add_argument("--no-peers", dest="peers", action="store_false")
    parser.add_argument("--redis", default=DRAMATIQ_REDIS, help="dramatiq's own Redis database")
    parser.add_argument("--out", type=Path, default=None, help="results file")
    return parser.parse_args()


def main() -> None:
    """Run everything and print the table, the ratios and the targets."""
    args = parse()
    out = args.out or RESULTS / f"compare-{dt.date.today().isoformat()}.txt"
    with out.open("a") as sink, tempfile.TemporaryDirectory(prefix="jobguard-bench-") as tmp:
        say = Tee(sink)
        folder = Path(tmp)
        with scratch_database() as database_url:
            say(f"$ python -m bench.compare {' '.join(sys.argv[1:])}".rstrip())
            say(
                f"machine: {platform.machine()}, {os.cpu_count()} cores, Python "
                f"{platform.python_version()}; {server_settings(database_url)}; "
                f"load average at start {os.getloadavg()[0]:.1f}; SQLite "
                f"{sqlite3.sqlite_version} synchronous=FULL"
            )
            say(
                f"drains: {args.jobs} jobs; pickup: {args.rate} jobs/s for {args.seconds:.0f} s "
                f"after {args.idle_s:.0f} s idle"
            )
            say(HEADER)
            lines: list[Line] = []
            names = {"postgres": "PostgreSQL", "sqlite": "SQLite"}
            for kind in args.backends.split(","):
                runs = JobguardRuns(kind, database_url, folder)
                lines += jobguard_lines(runs, args, say, names[kind])
            if args.peers:
                db = PeerDatabase(database_url)
                peers: list[Procrastinate | Dramatiq] = [
                    Procrastinate(db, folder),
                    Dramatiq(db, folder, args.redis),
                ]
                for peer in peers:
                    for threads in args.peer_concurrency:
                        drain = partial(peer.drain, args.jobs, args.workers, threads)
                        drained = again(say, peer.name, drain)
                        pickup = partial(
                            peer.pickup, args.workers, threads, args.rate, args.seconds, args.idle_s
                        )
                        paced = again(say, peer.name, pickup)
                        shape = f"{args.workers}x{threads}"
                        lines.append(peer_line(peer.name, peer.store, shape, drained, paced))
                        say(render(lines[-1]))
            verdicts(lines, args, say)
        say()


if __name__ == "__main__":
    main()
