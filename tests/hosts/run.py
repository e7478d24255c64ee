"""One run of the order workload on a host queue: real worker processes, a producer, SIGKILLs.

The host is described by a :class:`Host` (how to start its worker, how to send an order, whether
its broker still holds work); the run is the same for every host:

1. the business tables are created beside the store;
2. ``workers`` worker processes start (each its own process group);
3. the producer sends each order 1-3 times (the plan's shuffled sends), as a webhook would;
4. meanwhile ``kills`` times, a process running a handler (read from the event log) is SIGKILLed;
5. the run waits until ``done()`` holds (all kills made), then stops the workers.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from jobguard.diagnostics import Severity, diagnose, read_snapshot
from jobguard.models import Attempt
from tests.hosts import workload
from tests.support import stores
from tests.support.procs import REPO_ROOT


@dataclass
class Host:
    """What differs between hosts."""

    name: str
    worker_command: list[str]
    ready_marker: str  # a line the worker prints once it consumes
    send: Callable[[int], Any]
    drained: Callable[[], bool]
    send_fragile: Callable[[int], Any]  # the deduplicated task that fails until fixed
    send_limited: Callable[[int], Any]  # the task whose runs share a concurrency limit of one
    queued: Callable[[], int]  # messages waiting in the broker's queue
    limit_s: float  # the host's own limit on the order task's run (what redelivers or kills it)


@dataclass
class Outcome:
    """What the run saw."""

    kills: int
    duplicated: set[int]
    overlapping: dict[int, list[workload.Run]]  # order -> its runs
    finished: bool
    seconds: float
    never_run: set[int] = field(default_factory=set)  # orders whose stock was never cut
    uninvoiced: set[int] = field(default_factory=set)  # orders whose invoice was never written
    host: str = ""
    limit_s: float = 0.0  # the host's own limit on the order task's run


def _start(host: Host, env: dict[str, str], output: Path) -> subprocess.Popen[bytes]:
    with output.open("ab") as out:
        return subprocess.Popen(
            host.worker_command,
            cwd=REPO_ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _wait_ready(host: Host, workers: list[tuple[subprocess.Popen[bytes], Path]]) -> None:
    deadline = time.monotonic() + 60
    for popen, output in workers:
        while host.ready_marker not in output.read_text(errors="replace"):
            if popen.poll() is not None:
                raise RuntimeError(f"{host.name} worker exited: {output.read_text()[-3000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{host.name} worker not ready: {output.read_text()[-3000:]}")
            time.sleep(0.1)


Worker = tuple[subprocess.Popen[bytes], Path]


def start_worker(host: Host, env: dict[str, str], output: Path) -> Worker:
    """One worker process of ``host``, started and ready to consume."""
    worker = (_start(host, env, output), output)
    _wait_ready(host, [worker])
    return worker


def stop_workers(workers: list[Worker]) -> None:
    """SIGKILL every worker's process group and reap them."""
    _stop(workers)


def _stop(workers: list[tuple[subprocess.Popen[bytes], Path]]) -> None:
    for popen, _ in workers:
        if popen.poll() is None:
            os.killpg(popen.pid, signal.SIGKILL)
    for popen, _ in workers:
        popen.wait(timeout=30)


def _restart_exited(
    host: Host, env: dict[str, str], procs: list[tuple[subprocess.Popen[bytes], Path]]
) -> None:
    """Start a worker again whose whole process exited (Dramatiq stops when one of its
    processes is killed), as a process supervisor would."""
    for index, (popen, output) in enumerate(procs):
        if popen.poll() is not None:
            procs[index] = (_start(host, env, output), output)


def log_kill(log: Path, victim: int) -> None:
    """Record a SIGKILL in the event log (the run of ``victim`` ends there)."""
    line = json.dumps({"kind": "kill", "victim": victim, "pid": os.getpid(), "t": time.time()})
    with log.open("a", encoding="utf-8") as out:
        out.write(line + "\n")


def _killer(log: Path, kills: int, stop: threading.Event, rng: random.Random) -> None:
    """SIGKILL a process in the middle of a handler, ``kills`` times, a little apart."""
    done = 0
    while done < kills and not stop.wait(0.3 + rng.random() * 0.7):
        running = workload.running_pids(log)
        if not running:
            continue
        victim = rng.choice(running)
        try:
            os.kill(victim, signal.SIGKILL)
        except ProcessLookupError:
            continue
        log_kill(log, victim)
        done += 1


def run(
    host: Host,
    *,
    store_url: str,
    tmp: Path,
    env: dict[str, str],
    plan: workload.Plan,
    workers: int,
    kills: int,
    done: Callable[[], bool],
    timeout_s: float,
) -> Outcome:
    """Run the workload (see the module docstring) and judge it."""
    log = Path(env["HOSTQ_LOG"])
    started = time.monotonic()
    procs = []
    for index in range(workers):
        output = tmp / f"{host.name}-worker-{index}.out"
        procs.append((_start(host, env, output), output))
    stop = threading.Event()
    try:
        _wait_ready(host, procs)
        rng = random.Random(plan.seed)
        killer = threading.Thread(target=_killer, args=(log, kills, stop, rng), daemon=True)
        killer.start()
        for order in plan.sends:
            host.send(order)
            time.sleep(rng.random() * 0.02)
        deadline = time.monotonic() + timeout_s
        finished = False
        while time.monotonic() < deadline:
            if not killer.is_alive() and done():
                finished = True
                break
            _restart_exited(host, env, procs)
            time.sleep(0.25)
    finally:
        stop.set()
        _stop(procs)
    return Outcome(
        kills=workload.killed(log),
        duplicated=workload.duplicated_orders(store_url),
        overlapping=workload.overlapping_orders(log),
        finished=finished,
        seconds=time.monotonic() - started,
    )


# A plain run may never settle: Celery restores a task still running past the visibility
# timeout, and the restored copies of the slow orders (each again longer than the timeout)
# multiply and stay at the head of the queue, so some orders are never started at all. A plain
# run ends once every order's stock was cut or once no new order's was for this long (longer
# than a slow task and the broker's restore period): its duplicates are there by then.
PLAIN_STALL_S = 4 * workload.SLOW_S


class Progress:
    """When a count last grew (the plain run's end when it stops growing)."""

    def __init__(self, stall_s: float) -> None:
        self.stall_s = stall_s
        self.count = -1
        self.changed = time.monotonic()

    def stalled(self, count: int) -> bool:
        """Whether ``count`` has not grown for ``stall_s``."""
        if count != self.count:
            self.count, self.changed = count, time.monotonic()
        return time.monotonic() - self.changed >= self.stall_s


def run_orders(
    make_host: Callable[[str, bool], Host],
    *,
    store_url: str,
    broker_url: str,
    tmp: Path,
    monkeypatch: Any,
    plan: workload.Plan,
    kills: int,
    guarded: bool,
) -> Outcome:
    """The workload of ``plan`` on 2 workers with ``kills`` SIGKILLs, until it settled: plain,
    until every order's stock was cut (the plain hosts' redeliveries of slow tasks may keep
    coming long after) or no new order's was for :data:`PLAIN_STALL_S`; guarded, until every
    order's job is completed or dead and the broker holds nothing."""
    env = workload.worker_env(store_url, tmp / "events.log", broker_url, plan.slow_every)
    for name in ("HOSTQ_STORE", "HOSTQ_LOG", "HOSTQ_BROKER", "HOSTQ_SLOW_EVERY"):
        monkeypatch.setenv(name, env[name])  # the producer imports the same module
    workload.create_tables(store_url)
    host = make_host(broker_url, guarded)
    progress = Progress(PLAIN_STALL_S)

    def settled() -> bool:
        if not guarded:
            cut = len(workload.effect_counts(store_url, workload.CUTS))
            return cut == plan.orders or progress.stalled(cut)
        return workload.every_order_settled(store_url, workload.TASK, plan.orders) and (
            host.drained()
        )

    outcome = run(
        host, store_url=store_url, tmp=tmp, env=env, plan=plan, workers=2, kills=kills,
        done=settled, timeout_s=workload.run_bound_s(plan),
    )  # fmt: skip
    outcome.host, outcome.limit_s = host.name, host.limit_s
    orders = set(range(1, plan.orders + 1))
    outcome.never_run = orders - set(workload.effect_counts(store_url, workload.CUTS))
    outcome.uninvoiced = orders - set(workload.effect_counts(store_url, workload.INVOICES))
    print(report(host.name, guarded, store_url, plan, outcome))
    assert outcome.finished
    assert outcome.kills == kills
    return outcome


def report(host: str, guarded: bool, store_url: str, plan: workload.Plan, o: Outcome) -> str:
    """One line of what a run saw (read with ``pytest -s``)."""
    return (
        f"{host} {'guarded' if guarded else 'plain'} on {stores.kind_of(store_url)}: "
        f"{plan.orders} orders, {len(plan.sends)} sends, {o.kills} kills, "
        f"{len(o.duplicated)} duplicated, {len(o.overlapping)} overlapping, "
        f"{len(o.never_run)} never run, {len(o.uninvoiced)} without invoice, "
        f"{len(workload.dead_orders(store_url, workload.TASK))} dead, {o.seconds:.0f} s"
    )


def assert_guarded(outcome: Outcome, store_url: str, plan: workload.Plan) -> None:
    """Acceptance 1 of a guarded run: no duplicate, no overlap, every order completed.

    Each kill costs an order one attempt, far from its max_attempts, so none is dead. And the
    doctor reads the run as it reads jobguard's own jobs, judging the durations against the
    host's own limit.
    """
    assert outcome.duplicated == set()
    assert outcome.overlapping == {}, f"overlapping runs: {outcome.overlapping}"
    assert workload.dead_orders(store_url, workload.TASK) == set()
    assert len(workload.effect_counts(store_url, workload.INVOICES)) == plan.orders
    assert_doctor_judges_the_host_limit(store_url, outcome.host, outcome.limit_s)


def assert_doctor_judges_the_host_limit(store_url: str, host: str, limit_s: float) -> None:
    """``jobguard doctor``'s durations of the order task: against the limit the host reported
    on its jobs; a problem where the slow orders outlast it (Celery's 2 s visibility timeout),
    silent where it leaves room (the lock TTL is judged as for any task)."""
    backend = stores.open_backend(store_url)
    try:
        diagnosis = diagnose(read_snapshot(backend, task=workload.TASK))
    finally:
        backend.close()
    (durations,) = diagnosis.durations
    assert durations.host_limit is not None
    assert (durations.host_limit.host, durations.host_limit.timeout_s) == (host, limit_s)
    settings = {(a.severity, a.setting) for a in durations.advice}
    # The shadow job's 3 s lease is below the slow runs too, but the heartbeat renews it: it
    # is not what the host redelivers by, so it is not judged.
    assert "visibility_timeout_s" not in {setting for _, setting in settings}
    if limit_s < workload.SLOW_S:
        assert (Severity.PROBLEM, "host_timeout") in settings
        assert durations.host_outlasted > 0
    else:
        assert "host_timeout" not in {setting for _, setting in settings}


def use_env(
    store_url: str,
    broker_url: str,
    tmp: Path,
    mp: pytest.MonkeyPatch,
    slow_every: int = 1000,
) -> dict[str, str]:
    """The workers' environment of a test (:func:`workload.worker_env`, its event log in
    ``tmp``), also set in this process, which sends the tasks and reads the log."""
    env = workload.worker_env(store_url, tmp / "events.log", broker_url, slow_every)
    for name in ("HOSTQ_STORE", "HOSTQ_LOG", "HOSTQ_BROKER", "HOSTQ_SLOW_EVERY"):
        mp.setenv(name, env[name])
    return env


def attempts_of(store_url: str, operation_key: str | None = None) -> list[Attempt]:
    """The attempt log of one operation, or the latest thousand attempts."""
    backend = stores.open_backend(store_url)
    try:
        return backend.attempts(operation_key=operation_key, limit=1000)
    finally:
        backend.close()
