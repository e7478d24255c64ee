"""What the benches read back: business rows, paced enqueues, the app modules they load, and
how they print the rounds of a measure."""

from __future__ import annotations

import importlib
import os
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from types import ModuleType


@dataclass
class Effects:
    """What the business rows of one run say."""

    rows: int
    distinct: int
    first_start: float
    last_done: float
    started: dict[int, float]  # job number -> when its handler started (first run)

    @property
    def span_s(self) -> float:
        """First handler start to last row written."""
        return self.last_done - self.first_start


def read_effects(rows: Iterable[tuple[int, float, float]]) -> Effects:
    """Summarise ``(n, started_at, done_at)`` rows."""
    started: dict[int, float] = {}
    count, last_done = 0, 0.0
    for n, started_at, done_at in rows:
        count += 1
        started[n] = min(started_at, started.get(n, started_at))
        last_done = max(last_done, done_at)
    return Effects(count, len(started), min(started.values()), last_done, started)


@dataclass
class Cpu:
    """CPU seconds a drain cost: the worker processes (start-up included), the database's
    server processes serving their connections, and the Redis server (dramatiq's broker)."""

    workers_s: float
    database_s: float
    broker_s: float = 0.0

    def per_job_ms(self, jobs: int) -> str:
        """``workers + database (+ broker)`` in ms per job."""
        text = f"{self.workers_s / jobs * 1000:.2f} + {self.database_s / jobs * 1000:.2f}"
        if self.broker_s:
            text += f" + {self.broker_s / jobs * 1000:.2f}"
        return text


EFFECT_ROWS = "SELECT n, started_at, done_at FROM bench_effects"


@dataclass
class Sent:
    """When each paced enqueue was called and when it returned (the job then committed)."""

    called: list[float]
    returned: list[float]

    def call_ms(self) -> list[float]:
        """How long each enqueue call took."""
        return sorted((r - c) * 1000 for c, r in zip(self.called, self.returned, strict=True))

    def delay_ms(self, started: dict[int, float]) -> list[float]:
        """From each enqueue's return to ``started[n]`` (the same host's wall clock)."""
        return sorted((at - self.returned[n]) * 1000 for n, at in started.items())


def pace(send: Callable[[int], object], rate_per_s: int, seconds: float) -> Sent:
    """Call ``send(n)`` one at a time at ``rate_per_s`` for ``seconds``."""
    interval = 1.0 / rate_per_s
    sent = Sent([], [])
    next_at = time.perf_counter()
    for n in range(int(rate_per_s * seconds)):
        sent.called.append(time.time())
        send(n)
        sent.returned.append(time.time())
        next_at += interval
        pause = next_at - time.perf_counter()
        if pause > 0:
            time.sleep(pause)
    return sent


def load(name: str, url: str) -> ModuleType:
    """Import (or re-import) a bench app module against the database at ``url``."""
    os.environ["JOBGUARD_BENCH_URL"] = url
    return importlib.reload(importlib.import_module(name))


def median_line(label: str, values: list[float], width: int) -> str:
    """``label``, the median of ``values`` and each of them, as one line of a table."""
    spread = ", ".join(f"{value:.1f}" for value in values)
    return f"{label:<{width}} {statistics.median(values):7.1f}   ({spread})"
