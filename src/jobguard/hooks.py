"""Extension points for metrics, logs and diagnostics: a typed class of no-op methods.

Subclass :class:`Hooks`, override what you need and pass an instance to ``App(hooks=...)``.
Hooks run on worker threads; keep them fast and never raise from them.
"""

from __future__ import annotations

from jobguard.models import Delivery, Outcome


class Hooks:
    """No-op base; every method is called directly by the worker or the pipeline."""

    def worker_started(self, worker_id: str, queues: list[str]) -> None:
        """The worker started fetching."""

    def worker_stopped(self, worker_id: str, released: int) -> None:
        """The worker stopped; ``released`` leases were handed back uncharged."""

    def delivery_settled(self, delivery: Delivery, outcome: Outcome, duration_s: float) -> None:
        """A delivery ended (including refused writes of a stale delivery)."""

    def lease_lost(self, delivery: Delivery, reason: str) -> None:
        """The heartbeat found a lease or lock no longer ours."""

    def worker_failed(self, worker_id: str, reason: str) -> None:
        """The worker stopped taking work because a part it relies on failed (the heartbeat)."""

    def store_error(self, where: str, error: BaseException) -> None:
        """A store call failed (the worker keeps going and retries)."""
