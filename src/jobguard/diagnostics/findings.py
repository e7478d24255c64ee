"""What the doctor concludes: one :class:`Finding` per cause, with its severity, task, keys and
numbers, in a shape stable enough for a CI gate (``jobguard doctor --json``).

The checks build their own detailed records (an :class:`~.overlaps.Overlap`, an
:class:`~.outages.Outage`, ...) and each turns them into findings; :mod:`.report` collects them.
A ``problem`` makes ``jobguard doctor`` exit 1; a ``warning`` deserves a look; a ``hint`` is
advice that needs no action.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum


class Severity(StrEnum):
    """How urgent a finding is; ``problem`` makes ``jobguard doctor`` exit 1."""

    PROBLEM = "problem"
    WARNING = "warning"
    HINT = "hint"


class Kind(StrEnum):
    """What a finding is about; each value is documented in ``docs/diagnostics.md``."""

    OVERLAP = "overlap"
    RESOURCE_OVERLAP = "resource_overlap"
    SLOT_OVERRUN = "slot_overrun"
    FENCE_REFUSED = "fence_refused"
    LEASE = "visibility_timeout"
    LOCK_TTL = "lock_ttl"
    QUEUE = "queue"
    OUTAGE = "outage"
    POISON = "poison"
    RETRY_SPIKE = "retry_spike"
    CRASH_LOOP = "crash_loop"
    WORKER_DEATHS = "worker_deaths"
    STALL = "stall"
    SPLIT_OPERATION = "split_operation"
    LATE_DUPLICATE = "late_duplicate"
    UNSTABLE_DEDUP_KEY = "unstable_dedup_key"
    STARVATION = "starvation"
    SHORT_COMPLETION = "short_completion"
    MISSING_EXTERNAL_REF = "missing_external_ref"
    MISSING_RECORD = "missing_record"
    STUCK_PROCESSING = "stuck_processing"


@dataclass(frozen=True, slots=True)
class Keys:
    """The jobs, operations, resources and attempts a finding is about (empty: not relevant)."""

    job_ids: tuple[int, ...] = ()
    """The jobs the finding is about (for a crash loop: the culprits)."""
    other_job_ids: tuple[int, ...] = ()
    """Jobs affected by it but not its cause (for a crash loop: the collateral; for an outage:
    the jobs still buried)."""
    operation_keys: tuple[str, ...] = ()
    resource_keys: tuple[str, ...] = ()
    dedup_keys: tuple[str, ...] = ()
    attempt_ids: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Finding:
    """One cause the doctor names, with what to do about it."""

    kind: Kind
    severity: Severity
    task: str | None
    """The task involved (``None``: several, or none in particular)."""
    summary: str
    """What was seen, in one sentence."""
    advice: str
    """What to do about it."""
    keys: Keys = field(default_factory=Keys)
    numbers: Mapping[str, float] = field(default_factory=dict)
    """Counts and durations behind the finding; each kind's names are documented."""

    @property
    def line(self) -> str:
        """The finding as one line of the summary: what was seen, then what to do."""
        return f"{self.summary}; {self.advice}" if self.advice else self.summary


def ids(values: Iterable[int], limit: int = 10) -> str:
    """Ids in numeric order for a message, ``1, 2, 3``, shortened past ``limit``."""
    ordered = sorted(set(values))
    shown = ", ".join(str(value) for value in ordered[:limit])
    return shown + (f" and {len(ordered) - limit} more" if len(ordered) > limit else "")


def seconds(value: float) -> str:
    """A duration for a message: ``250 ms`` under a second, ``1.50 s`` above."""
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"
