"""Prometheus metrics: a worker's counters from its hooks, and the store's gauges at scrape time.

Metric names follow Prometheus conventions (``_total`` counters, ``_seconds`` units) and every
label has a bounded set of values: task and queue names (at most :data:`MAX_LABEL_VALUES` of
each, the rest reported as ``other``), outcomes and fixed reasons; never a job id or a key.

Worker metrics (:class:`MetricsHooks`), labels in brackets: ``jobguard_deliveries_total``
[task, queue, outcome], ``jobguard_enqueued_total`` and ``jobguard_dedup_hits_total`` [task,
queue], ``jobguard_retries_total``, ``jobguard_lock_busy_deferrals_total`` [task, queue],
``jobguard_stale_refusals_total`` [task, queue, guard=lease|fence],
``jobguard_lease_renewals_total``, ``jobguard_lease_renewal_failures_total``
[reason=lease_lost|lock_lost|store_error], ``jobguard_handler_duration_seconds`` (histogram)
[task] and ``jobguard_store_errors_total`` [where]. ``docs/observability.md`` describes each.

Store metrics (:class:`StoreCollector`, per queue): ``jobguard_queue_depth`` (ready),
``jobguard_queue_scheduled``, ``jobguard_jobs_in_flight``, ``jobguard_queue_oldest_age_seconds``,
``jobguard_dlq_size``, ``jobguard_queue_paused`` (1 while paused), and ``jobguard_store_up``
(0 when the read failed).

Known label sets start at zero, so dashboards and absence alerts work before the first event:
every task and queue a worker declares (:meth:`MetricsHooks.declare`), every outcome, guard,
renewal failure and store call; and every queue the exporter knows (its app's tasks' queues,
and each queue it has seen hold a job).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from jobguard.exceptions import ConfigurationError, JobGuardError
from jobguard.hooks import AttemptEvent, Hooks
from jobguard.models import Delivery, Job, Outcome, QueueStats

if TYPE_CHECKING:
    from jobguard.app import App
    from jobguard.task import Task

MAX_LABEL_VALUES = 200
OTHER = "other"
# Handler runs from 5 ms to 10 minutes: jobs range from a quick write to a slow export.
DURATION_BUCKETS_S = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
)  # fmt: skip
RAN_HANDLER = frozenset(
    {
        Outcome.COMPLETED,
        Outcome.RETRY,
        Outcome.TIMED_OUT,
        Outcome.DEAD,
        Outcome.LEASE_REFUSED,
        Outcome.FENCE_REFUSED,
    }
)
_RENEWAL_FAILURES = ("lease_lost", "lock_lost", "store_error")
STORE_ERROR_PLACES = (
    "fetch",
    "wait",
    "pipeline",
    "settle",
    "release",
    "prune",
    "heartbeat",
    "schedule",
)
"""The store calls a worker or scheduler counts failures of (``where``), served from 0."""
# The counters and the histogram one kind of delivery (task, queue, outcome) feeds.
_Children = tuple[tuple[Counter, ...], Histogram | None]


class BoundedLabel:
    """Keeps a label's values to a fixed number: later new values are reported as ``other``."""

    def __init__(self, limit: int = MAX_LABEL_VALUES) -> None:
        self._limit = limit
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, value: str) -> str:
        """``value`` while fewer than ``limit`` values were seen, else ``other``."""
        if value in self._seen:
            return value
        with self._lock:
            if len(self._seen) < self._limit:
                self._seen.add(value)
                return value
        return OTHER


class MetricsHooks(Hooks):
    """Counts what a worker (or a producer) does into a Prometheus registry.

    Args:
        registry: Where the metrics are registered (default: a new registry of its own, so two
            apps in one process never collide); serve it with :func:`serve`.
        duration_buckets_s: Upper bounds of the handler duration histogram.
    """

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        duration_buckets_s: Sequence[float] = DURATION_BUCKETS_S,
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self._task = BoundedLabel()
        self._queue = BoundedLabel()
        self._children: dict[tuple[str, str, Outcome], _Children] = {}
        r = self.registry
        per_job = ["task", "queue"]
        self.deliveries = Counter(
            "jobguard_deliveries",
            "Deliveries by how they ended.",
            [*per_job, "outcome"],
            registry=r,
        )
        self.enqueued = Counter("jobguard_enqueued", "Jobs stored.", per_job, registry=r)
        self.dedup_hits = Counter(
            "jobguard_dedup_hits",
            "Enqueues answered by the live job of the key.",
            per_job,
            registry=r,
        )
        self.retries = Counter(
            "jobguard_retries",
            "Deliveries that failed and were scheduled again.",
            per_job,
            registry=r,
        )
        self.deferrals = Counter(
            "jobguard_lock_busy_deferrals",
            "Deliveries deferred because the resource lock or the operation was busy.",
            per_job,
            registry=r,
        )
        self.refusals = Counter(
            "jobguard_stale_refusals",
            "Writes of a stale delivery refused (guard: lease or fence).",
            [*per_job, "guard"],
            registry=r,
        )
        self.renewals = Counter(
            "jobguard_lease_renewals", "Leases (with their locks) extended.", registry=r
        )
        self.renewal_failures = Counter(
            "jobguard_lease_renewal_failures",
            "Renewals that failed: lease or lock taken over, or the store failed a beat.",
            ["reason"],
            registry=r,
        )
        self.durations = Histogram(
            "jobguard_handler_duration_seconds",
            "How long handlers ran (deliveries that ran one).",
            ["task"],
            buckets=tuple(duration_buckets_s),
            registry=r,
        )
        self.store_errors = Counter(
            "jobguard_store_errors", "Store calls that failed.", ["where"], registry=r
        )
        for reason in _RENEWAL_FAILURES:
            self.renewal_failures.labels(reason)  # present at 0 from the first scrape
        for where in STORE_ERROR_PLACES:
            self.store_errors.labels(where)

    def declare(self, tasks: Iterable[Task]) -> None:
        """Serve every series of these tasks (on their queues) at 0 before their first event.

        ``jobguard worker --metrics-port`` declares the app's tasks; call it with
        ``app.tasks.values()`` when you serve the registry yourself.
        """
        for task in tasks:
            for outcome in Outcome:
                if outcome is not Outcome.RUNNING:
                    self._children_of(task.name, task.queue, outcome)
            labels = self._labels(task.name, task.queue)
            self.enqueued.labels(*labels)
            self.dedup_hits.labels(*labels)

    def _labels(self, task: str, queue: str) -> tuple[str, str]:
        return self._task(task), self._queue(queue)

    def job_enqueued(self, job: Job) -> None:
        """Count a stored job or a dedup hit."""
        task, queue = self._labels(job.task, job.queue)
        (self.dedup_hits if job.deduplicated else self.enqueued).labels(task, queue).inc()

    def attempt_ended(self, event: AttemptEvent) -> None:
        """Count the delivery by outcome and observe its handler's duration."""
        delivery = event.delivery
        key = (delivery.task, delivery.queue, event.outcome)
        children = self._children.get(key)
        if children is None:
            children = self._children_of(*key)
        counters, duration = children
        for counter in counters:
            counter.inc()
        if duration is not None:
            duration.observe(event.duration_s)

    def _children_of(self, task_name: str, queue_name: str, outcome: Outcome) -> _Children:
        """The labelled series one kind of delivery feeds, looked up once and kept."""
        task, queue = self._labels(task_name, queue_name)
        counters: list[Counter] = [self.deliveries.labels(task, queue, outcome.value)]
        if outcome is Outcome.RETRY:
            counters.append(self.retries.labels(task, queue))
        elif outcome is Outcome.DEFERRED:
            counters.append(self.deferrals.labels(task, queue))
        elif outcome is Outcome.LEASE_REFUSED:
            counters.append(self.refusals.labels(task, queue, "lease"))
        elif outcome is Outcome.FENCE_REFUSED:
            counters.append(self.refusals.labels(task, queue, "fence"))
        duration = self.durations.labels(task) if outcome in RAN_HANDLER else None
        children = (tuple(counters), duration)
        if len(self._children) < MAX_LABEL_VALUES * len(Outcome):
            self._children[(task_name, queue_name, outcome)] = children
        return children

    def leases_renewed(self, count: int) -> None:
        """Count the leases a heartbeat beat extended."""
        self.renewals.inc(count)

    def lease_lost(self, delivery: Delivery, reason: str) -> None:
        """Count a renewal that found the lease or the lock taken over."""
        self.renewal_failures.labels("lock_lost" if "lock" in reason else "lease_lost").inc()

    def store_error(self, where: str, error: BaseException) -> None:
        """Count a failed store call; a failed heartbeat is a failed renewal too."""
        self.store_errors.labels(where if where.isidentifier() else OTHER).inc()
        if where == "heartbeat":
            self.renewal_failures.labels("store_error").inc()


class StoreCollector(Collector):
    """Reads the store at scrape time: per queue depth, in flight, oldest age and DLQ size.

    One scrape costs the three aggregate reads of :meth:`App.queue_stats`; a failed read is
    reported as ``jobguard_store_up 0`` instead of failing the scrape. Every queue of the app's
    tasks, and every queue an earlier scrape saw hold a job, is served at 0 when it has none.
    """

    def __init__(self, app: App) -> None:
        self.app = app
        # Queues to serve even when empty, in the order first known (at most MAX_LABEL_VALUES).
        self._known: dict[str, None] = {}

    def collect(self) -> Iterator[Metric]:
        """Yield the gauges (called by the registry on every scrape)."""
        up = GaugeMetricFamily("jobguard_store_up", "1 if the store answered this scrape.")
        try:
            stats = self.app.queue_stats()
            now = self.app.backend.now()
        except JobGuardError:
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        gauges = {
            "depth": GaugeMetricFamily(
                "jobguard_queue_depth", "Queued jobs ready to run.", labels=["queue"]
            ),
            "scheduled": GaugeMetricFamily(
                "jobguard_queue_scheduled",
                "Queued jobs waiting for their time (delay, backoff, deferral).",
                labels=["queue"],
            ),
            "running": GaugeMetricFamily(
                "jobguard_jobs_in_flight", "Jobs under a lease.", labels=["queue"]
            ),
            "oldest": GaugeMetricFamily(
                "jobguard_queue_oldest_age_seconds",
                "How long the oldest ready job has waited (0 when none is ready).",
                labels=["queue"],
            ),
            "dead": GaugeMetricFamily(
                "jobguard_dlq_size", "Jobs in the dead letter queue.", labels=["queue"]
            ),
            "paused": GaugeMetricFamily(
                "jobguard_queue_paused", "1 while the queue is paused, else 0.", labels=["queue"]
            ),
        }
        for name in [*self.app.queues(), *(queue.queue for queue in stats)]:
            if len(self._known) < MAX_LABEL_VALUES:
                self._known.setdefault(name)
        present = {queue.queue for queue in stats}
        drained = [QueueStats(name) for name in self._known if name not in present]
        for queue in capped_queues([*stats, *drained]):
            label = [queue.queue]
            gauges["depth"].add_metric(label, queue.ready)
            gauges["scheduled"].add_metric(label, queue.scheduled)
            gauges["running"].add_metric(label, queue.running)
            oldest = 0.0 if queue.oldest_ready_at is None else max(0.0, now - queue.oldest_ready_at)
            gauges["oldest"].add_metric(label, oldest)
            gauges["dead"].add_metric(label, queue.dead)
            gauges["paused"].add_metric(label, int(queue.paused))
        yield from gauges.values()


def capped_queues(stats: list[QueueStats], limit: int = MAX_LABEL_VALUES) -> list[QueueStats]:
    """The first ``limit`` queues by name as they are; the others summed as one ``other``
    queue (its oldest job the oldest of theirs), so the queue label stays bounded."""
    ordered = sorted(stats, key=lambda queue: queue.queue)
    kept, rest = ordered[:limit], ordered[limit:]
    if not rest:
        return kept
    named = [queue for queue in kept if queue.queue != OTHER]
    folded = [*rest, *(queue for queue in kept if queue.queue == OTHER)]

    def least(values: list[float | None]) -> float | None:
        return min((value for value in values if value is not None), default=None)

    other = QueueStats(
        queue=OTHER,
        ready=sum(queue.ready for queue in folded),
        scheduled=sum(queue.scheduled for queue in folded),
        running=sum(queue.running for queue in folded),
        dead=sum(queue.dead for queue in folded),
        oldest_ready_at=least([queue.oldest_ready_at for queue in folded]),
        oldest_running_since=least([queue.oldest_running_since for queue in folded]),
        shortest_lease_s=least([queue.shortest_lease_s for queue in folded]),
    )
    return [*named, other]


def store_registry(app: App) -> CollectorRegistry:
    """A registry holding only a :class:`StoreCollector` over ``app`` (the exporter's)."""
    registry = CollectorRegistry()
    registry.register(StoreCollector(app))
    return registry


def serve(registry: CollectorRegistry, port: int, host: str = "127.0.0.1") -> tuple[str, int]:
    """Serve ``registry`` at ``http://host:port/metrics`` on a daemon thread.

    Returns the address bound (``port=0`` picks a free port). The server lives as long as the
    process. :class:`~jobguard.exceptions.ConfigurationError` if the address cannot be bound.
    """
    from prometheus_client import start_http_server

    try:
        server, _thread = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        raise ConfigurationError(
            f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}"
        ) from exc
    bound_host, bound_port = server.server_address[:2]
    return str(bound_host), int(bound_port)
