"""Which dead jobs a bulk replay or purge touches: a validated, frozen filter (#17).

A :class:`DeadFilter` is built once where the operator's input enters (CLI options, the
dashboard's form, an API call) and handed to the store as facts; nothing below re-checks it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from jobguard.core import checks
from jobguard.core.text import utc_text
from jobguard.exceptions import ConfigurationError
from jobguard.models import DeadCode, Job

_CODES = ", ".join(code.value for code in DeadCode)


@dataclass(frozen=True, slots=True)
class DeadFilter:
    """A selection of dead jobs; every field given must match, none given means all of them.

    Attributes:
        task: Only jobs of this task.
        queue: Only jobs on this queue.
        code: Only jobs buried for this reason (a :class:`~jobguard.models.DeadCode`).
        since: Only jobs buried at or after this time (store seconds since the epoch).
        until: Only jobs buried before this time (store seconds since the epoch).
        cutoff: Only jobs buried before this store time too: the moment a preview was taken
            (:meth:`~jobguard.deadletters.DeadLetterQueue.preview`), so that acting on the
            preview touches no job buried after it. Not an operator's filter; ``None``: none.
    """

    task: str | None = None
    queue: str | None = None
    code: DeadCode | None = None
    since: float | None = None
    until: float | None = None
    cutoff: float | None = None

    def __post_init__(self) -> None:
        checks.optional_text("task", self.task)
        checks.optional_text("queue", self.queue)
        if self.code is not None and not isinstance(self.code, DeadCode):
            raise ConfigurationError(f"code must be a DeadCode, got {self.code!r}")
        since = _moment("since", self.since)
        until = _moment("until", self.until)
        _moment("cutoff", self.cutoff)
        if since is not None and until is not None and since > until:
            raise ConfigurationError("--since is after --until: the time range selects nothing")

    @classmethod
    def parse(
        cls,
        *,
        task: str | None = None,
        queue: str | None = None,
        reason: str | None = None,
        since: str | None = None,
        until: str | None = None,
    ) -> DeadFilter:
        """A filter from an operator's text (CLI options, a form), each value checked.

        Args:
            task: Task name.
            queue: Queue name.
            reason: Dead code, one of ``fatal, exhausted, poison, unrunnable, lost, waited,
                cancelled``.
            since: ISO 8601 time (``2026-12-01T21:00:00Z``; no offset means UTC).
            until: ISO 8601 time, as ``since``.

        Raises:
            ConfigurationError: A value names what is wrong with it.
        """
        for name, value in (("task", task), ("queue", queue)):
            if value is not None and not value.strip():
                raise ConfigurationError(f"--{name} must not be empty")
        code = None
        if reason is not None:
            try:
                code = DeadCode(reason)
            except ValueError:
                raise ConfigurationError(
                    f"--reason {reason!r} is not a dead code (one of {_CODES})"
                ) from None
        return cls(
            task=task,
            queue=queue,
            code=code,
            since=_time("since", since),
            until=_time("until", until),
        )

    @property
    def buried_before(self) -> float | None:
        """The earliest of ``until`` and ``cutoff``: jobs buried at or after it are not
        selected (``None``: no upper bound)."""
        bounds = [value for value in (self.until, self.cutoff) if value is not None]
        return min(bounds) if bounds else None

    @property
    def everything(self) -> bool:
        """Whether no field narrows the selection (every dead job)."""
        return all(
            value is None for value in (self.task, self.queue, self.code, self.since, self.until)
        )

    def describe(self) -> str:
        """The selection in the CLI's words, e.g. ``queue=bulk reason=fatal``."""
        if self.everything:
            return "all dead jobs"
        parts = [
            f"{name}={value}"
            for name, value in (
                ("task", self.task),
                ("queue", self.queue),
                ("reason", self.code.value if self.code else None),
                ("since", _iso(self.since)),
                ("until", _iso(self.until)),
            )
            if value is not None
        ]
        return " ".join(parts)


@dataclass(frozen=True, slots=True)
class DeadPreview:
    """What a bulk action on a selection would touch, as shown before it is confirmed.

    The bound is the burial time: a burial whose transaction read the store clock before the
    preview did but committed only after the preview's reads (a window of that transaction's
    length) is not shown and is still selected.

    Attributes:
        selection: The selection with its ``cutoff`` set to the store time of the preview: act
            on this one to touch only what was shown (jobs buried later are left alone).
        count: How many dead jobs it selects.
        held: How many of them a replay would leave dead because a live job (or an earlier job
            of the selection, replayed first) holds their dedup key.
        first: The first selected jobs in id order.
    """

    selection: DeadFilter
    count: int
    held: int
    first: Sequence[Job]

    @property
    def cutoff_text(self) -> str:
        """The preview's store time, to the second, in UTC (``2026-12-02 01:01:53 UTC``)."""
        cutoff = self.selection.cutoff
        return "-" if cutoff is None else f"{utc_text(cutoff)} UTC"


@dataclass(frozen=True, slots=True)
class ReplayBatch:
    """What one transaction of a bulk replay did.

    Attributes:
        replayed: Ids of the jobs queued again.
        held: ``(dead job id, live holder id)`` for jobs left dead because a live job holds their
            dedup key.
        gone: How many selected jobs had already left the DLQ (another operator replayed or
            purged them first) and were skipped.
        last_id: The highest id looked at; the next batch starts after it.
    """

    replayed: list[int]
    held: list[tuple[int, int]]
    gone: int
    last_id: int


@dataclass(frozen=True, slots=True)
class ReplayReport:
    """What a whole bulk replay did (the batches added up)."""

    replayed: list[int]
    held: list[tuple[int, int]]
    gone: int

    def summary(self) -> str:
        """One line for the audit trail and the CLI."""
        return f"{len(self.replayed)} replayed, {len(self.held)} held, {self.gone} already gone"


def _moment(name: str, value: object) -> float | None:
    """A time in store seconds: a finite number, or ``None``."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigurationError(f"{name} must be a finite number of seconds, not {value!r}")
    return float(value)


def _time(name: str, text: str | None) -> float | None:
    """Seconds since the epoch from ISO 8601 text (no offset: UTC)."""
    if text is None:
        return None
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ConfigurationError(
            f"--{name} {text!r} is not a time: give ISO 8601, e.g. 2026-12-01T21:00:00Z"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def _iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, tz=UTC).isoformat().replace("+00:00", "Z")
