"""The demo's settings: sizes, timings and where its files live, shared with worker processes.

The parent writes them as JSON next to the database; each worker process reads that file, so
parent and workers agree on every number without passing a dozen flags.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from jobguard.demo.mailserver import MailFaults

# The mail API flakes at these rates per request (503, timeout, answer dropped after sending).
MAIL_FAULTS = MailFaults(error_rate=0.04, timeout_rate=0.02, drop_rate=0.03, timeout_s=1.5)


@dataclass(frozen=True, slots=True)
class DemoFiles:
    """Where one run keeps its database, the mail service's log, worker logs and settings."""

    db: Path
    mail_log: Path
    workers_log: Path
    settings: Path

    @classmethod
    def beside(cls, db: Path) -> DemoFiles:
        """The files of a run whose database is ``db``: siblings named after its stem."""
        stem = db.with_suffix("")
        return cls(
            db=db,
            mail_log=Path(f"{stem}.mail-log.json"),
            workers_log=Path(f"{stem}.workers.log"),
            settings=Path(f"{stem}.settings.json"),
        )


@dataclass(frozen=True, slots=True)
class DemoSettings:
    """Everything a run needs to know; identical in the parent and every worker process.

    Attributes:
        db_path: The SQLite file holding both the jobs and the shop's tables.
        mail_url: Base URL of the local mail service.
        orders: How many orders the shop receives.
        workers: Worker processes kept alive by the supervisor.
        seed: Decides every fault (see :mod:`jobguard.demo.faults`).
        unsafe: Protections off: the article's failure symptoms.
        concurrency: Handler threads per worker process.
        orders_per_s: How fast paid orders arrive (their webhooks fire as a stream).
        visibility_timeout_s: Lease length; slow jobs run longer (heartbeat carries them).
        lock_ttl_s: Resource lock length; shorter than the lease so a frozen worker loses its
            lock first and its next write is refused by the fence, not only by the lease.
        unsafe_visibility_timeout_s: The short lease of ``--unsafe`` (no heartbeat).
        slow_job_s: How long a slow job stalls, longer than both the lease and the lock.
        freeze_s: How long ``--unsafe`` freezes a worker (no lock there, so a fixed time).
        mail_timeout_s: The mail client's timeout; a ``timeout`` fault answers later than this.
        max_attempts: Deliveries per job before the dead letter queue.
        poison_threshold: The same error this many times in a row quarantines the job.
        backoff_base_s: Retry backoff base (full jitter).
        backoff_cap_s: Longest retry backoff.
    """

    db_path: str
    mail_url: str
    orders: int = 300
    workers: int = 4
    seed: int = 7
    unsafe: bool = False
    concurrency: int = 4
    orders_per_s: float = 50.0
    visibility_timeout_s: float = 2.0
    lock_ttl_s: float = 1.0
    unsafe_visibility_timeout_s: float = 0.5
    slow_job_s: float = 2.5
    freeze_s: float = 1.5
    mail_timeout_s: float = 1.0
    max_attempts: int = 10
    poison_threshold: int = 5
    backoff_base_s: float = 0.1
    backoff_cap_s: float = 1.0

    @property
    def mode(self) -> str:
        """``"safe"`` or ``"unsafe"``."""
        return "unsafe" if self.unsafe else "safe"

    def to_json(self) -> str:
        """Serialise (JSON, never pickle)."""
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> DemoSettings:
        """Read back what :meth:`to_json` wrote; unknown keys are an error."""
        data: dict[str, Any] = json.loads(text)
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown demo settings: {sorted(unknown)}")
        return cls(**data)
