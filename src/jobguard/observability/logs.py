"""Structured logs: one JSON line per attempt event, through the standard :mod:`logging` module.

:class:`JsonLogHooks` logs to the ``jobguard.attempts`` logger: ``attempt.started`` when a
delivery begins and ``attempt.ended`` with the attempt log's fields when it ends. Each record's
message is the JSON object, so any handler prints one line per event;
:func:`install_json_handler` adds a plain stderr handler (``jobguard worker --log-json``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import time
from collections.abc import Iterator
from typing import Any, TextIO

from jobguard.hooks import AttemptEvent, Hooks
from jobguard.models import Delivery, Outcome

LOGGER_NAME = "jobguard.attempts"
# Outcomes that deserve an operator's eye get WARNING; the rest are routine (INFO).
_WARN = frozenset(
    {
        Outcome.TIMED_OUT,
        Outcome.DEAD,
        Outcome.LOST,
        Outcome.LEASE_REFUSED,
        Outcome.FENCE_REFUSED,
    }
)


def _delivery_fields(delivery: Delivery) -> dict[str, Any]:
    return {
        "job_id": delivery.job_id,
        "attempt": delivery.attempt,
        "max_attempts": delivery.max_attempts,
        "task": delivery.task,
        "queue": delivery.queue,
        "operation_key": delivery.operation_key,
        "resource_key": delivery.resource_key,
        "lease_token": delivery.lease_token,
        "attempt_id": delivery.attempt_id,
    }


def event_fields(event: AttemptEvent) -> dict[str, Any]:
    """The JSON object logged for an ended attempt (the attempt log's fields)."""
    return {
        "event": "attempt.ended",
        **_delivery_fields(event.delivery),
        "worker_id": event.worker_id,
        "outcome": event.outcome.value,
        "duration_s": round(event.duration_s, 6),
        "lock_owner": event.lock_owner,
        "fence": event.fence,
        "steps_run": event.steps_run,
        "steps_skipped": event.steps_skipped,
        "reason": event.reason,
        "error_type": event.error_type,
        "error_message": event.error_message,
    }


class JsonLogHooks(Hooks):
    """Log every attempt event as one JSON object.

    Args:
        worker_id: Added to ``attempt.started`` lines (``attempt.ended`` carries its own).
        logger: Where to log (default ``logging.getLogger("jobguard.attempts")``).
    """

    def __init__(self, worker_id: str | None = None, logger: logging.Logger | None = None) -> None:
        self.worker_id = worker_id
        self.logger = logger or logging.getLogger(LOGGER_NAME)

    def _log(self, level: int, fields: dict[str, Any]) -> None:
        if self.logger.isEnabledFor(level):
            fields = {"ts": round(time.time(), 6), **fields}
            self.logger.log(level, json.dumps(fields, sort_keys=False, default=str))

    @contextlib.contextmanager
    def delivering(self, delivery: Delivery) -> Iterator[None]:
        """Log ``attempt.started``."""
        fields = {"event": "attempt.started", **_delivery_fields(delivery)}
        if self.worker_id is not None:
            fields["worker_id"] = self.worker_id
        self._log(logging.INFO, fields)
        yield

    def attempt_ended(self, event: AttemptEvent) -> None:
        """Log ``attempt.ended`` with the outcome and the attempt log's fields."""
        level = logging.WARNING if event.outcome in _WARN else logging.INFO
        self._log(level, event_fields(event))


def install_json_handler(stream: TextIO | None = None) -> logging.Handler:
    """Print the ``jobguard.attempts`` records as bare lines on ``stream`` (default stderr)."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger = logging.getLogger(LOGGER_NAME)
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    return handler
