"""Tasks: a handler plus its queue, timeouts, retry policy and key templates."""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

from jobguard.core.keys import check_key, render_key, template_fields
from jobguard.core.retry import RetryPolicy
from jobguard.exceptions import ConfigurationError, PayloadError
from jobguard.models import Job, JobSpec

if TYPE_CHECKING:
    from jobguard.backends.base import Backend


class TaskHost(Protocol):
    """What a task needs of the application that registered it (the App is one).

    A protocol, so this module knows nothing of the layer above it.
    """

    @property
    def backend(self) -> Backend:
        """The store jobs are enqueued into."""

    @property
    def max_payload_bytes(self) -> int:
        """Largest JSON payload accepted at enqueue."""

    def visibility_timeout_for(self, queue: str) -> float:
        """The lease length of ``queue`` for tasks that do not set their own."""


QUEUE_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,63}")
TASK_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.:<>-]{0,199}")  # <locals> of nested handlers


def check_queue_name(queue: str) -> str:
    """Queue names are plain identifiers (letters, digits, ``_`` and ``-``, 64 at most)."""
    if not isinstance(queue, str) or not QUEUE_NAME.fullmatch(queue):
        raise ConfigurationError(
            f"queue name {queue!r} is not a plain identifier "
            "(a letter, then letters, digits, '_' or '-'; 64 characters at most)"
        )
    return queue


def encode_payload(arguments: Mapping[str, Any], max_bytes: int) -> str:
    """Encode job arguments as canonical JSON (sorted keys), refusing non-JSON and oversize."""
    try:
        text = json.dumps(dict(arguments), sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise PayloadError(f"job arguments must be JSON-serialisable: {exc}") from exc
    size = len(text.encode("utf-8"))
    if size > max_bytes:
        raise PayloadError(f"payload is {size} bytes; the limit is {max_bytes} bytes")
    return text


def _key(
    what: str, literal: str | None, template: str | None, kwargs: Mapping[str, Any]
) -> str | None:
    """A per-call literal key wins over the task's template; neither means no key."""
    if literal is not None:
        return check_key(literal, what)
    if template:
        return render_key(template, kwargs)
    return None


@dataclass(frozen=True, slots=True)
class CallOptions:
    """Per-call enqueue options; see :meth:`Task.options`."""

    dedup_key: str | None = None
    dedup_window_s: float | None = None
    delay_s: float = 0.0
    priority: int | None = None
    queue: str | None = None
    operation_key: str | None = None
    resource_key: str | None = None


class Task:
    """A registered handler. Call :meth:`enqueue` to schedule it; call it directly to run inline.

    Created by :meth:`jobguard.App.task`; see there for the options.
    """

    def __init__(
        self,
        app: TaskHost,
        fn: Callable[..., Any],
        *,
        name: str,
        queue: str,
        visibility_timeout_s: float | None,
        policy: RetryPolicy,
        priority: int,
        operation_key: str | None,
        resource_key: str | None,
        lock_ttl_s: float,
        max_defer_s: float,
        dedup_window_s: float,
    ) -> None:
        if not TASK_NAME.fullmatch(name):
            raise ConfigurationError(f"task name {name!r} is not valid")
        if (visibility_timeout_s is not None and visibility_timeout_s <= 0) or lock_ttl_s <= 0:
            raise ConfigurationError("visibility_timeout_s and lock_ttl_s must be > 0")
        if max_defer_s < 0 or dedup_window_s < 0:
            raise ConfigurationError("max_defer_s and dedup_window_s must be >= 0")
        self.app = app
        self.fn = fn
        self.name = name
        self.queue = check_queue_name(queue)
        self.visibility_timeout_s = (
            float(visibility_timeout_s) if visibility_timeout_s is not None else None
        )
        self.policy = policy
        self.priority = priority
        self.operation_key = operation_key
        self.resource_key = resource_key
        self.lock_ttl_s = float(lock_ttl_s)
        self.max_defer_s = float(max_defer_s)
        self.dedup_window_s = float(dedup_window_s)
        self.signature = inspect.signature(fn)
        params = list(self.signature.parameters)
        if not params:
            raise ConfigurationError(
                f"task {name!r}: the handler must take ctx as its first argument"
            )
        argument_names = set(params[1:])
        if "connection" in argument_names:
            raise ConfigurationError(
                f"task {name!r}: the handler argument name 'connection' is reserved "
                "(enqueue(connection=...) names the transaction a job is written in); rename it"
            )
        accepts_any = any(
            p.kind is inspect.Parameter.VAR_KEYWORD for p in self.signature.parameters.values()
        )
        for template in (operation_key, resource_key):
            if template is None:
                continue
            for field in template_fields(template):
                if field not in argument_names and not accepts_any:
                    raise ConfigurationError(
                        f"task {name!r}: key template {template!r} names {field!r}, "
                        "which is not an argument of the handler"
                    )
        self.__doc__ = fn.__doc__
        self.__name__ = getattr(fn, "__name__", name)

    def __call__(self, /, *args: Any, **kwargs: Any) -> Any:
        """Call the handler directly (no queue, no guard)."""
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<Task {self.name} queue={self.queue}>"

    def options(
        self,
        *,
        dedup_key: str | None = None,
        dedup_window_s: float | None = None,
        delay_s: float = 0.0,
        priority: int | None = None,
        queue: str | None = None,
        operation_key: str | None = None,
        resource_key: str | None = None,
    ) -> BoundCall:
        """Per-call options, kept apart from the task's own arguments so names never clash.

        Args:
            dedup_key: Producer-side deduplication key (R5); an enqueue while a job holds it
                returns that job.
            dedup_window_s: Also hold the key this long after the job completes.
            delay_s: Do not run before this many seconds from now.
            priority: Higher runs first within a queue.
            queue: Override the task's queue.
            operation_key: A literal operation key for this call (instead of the template).
            resource_key: A literal resource key for this call (instead of the template).
        """
        return BoundCall(
            self,
            CallOptions(
                dedup_key=dedup_key,
                dedup_window_s=dedup_window_s,
                delay_s=delay_s,
                priority=priority,
                queue=queue,
                operation_key=operation_key,
                resource_key=resource_key,
            ),
        )

    def enqueue(self, /, *, connection: Any = None, **kwargs: Any) -> Job:
        """Schedule the task with these arguments; returns the stored (or deduplicated) job.

        With ``connection`` (your own open connection to the store's database: a psycopg
        connection on PostgreSQL, a ``sqlite3`` connection to the store's file on SQLite) the
        job is written in your transaction: it exists if and only if your transaction commits.
        """
        return self.app.backend.enqueue(
            self.build_spec(kwargs, CallOptions()), connection=connection
        )

    def enqueue_many(
        self, arguments: Iterable[Mapping[str, Any]], *, connection: Any = None
    ) -> list[Job]:
        """Schedule one job per argument mapping, all in one transaction (all or none).

        ``connection`` as in :meth:`enqueue`.
        """
        specs = [self.build_spec(kwargs, CallOptions()) for kwargs in arguments]
        return self.app.backend.enqueue_many(specs, connection=connection)

    def build_spec(self, kwargs: Mapping[str, Any], options: CallOptions) -> JobSpec:
        """Validate arguments and options and build the :class:`JobSpec` (no I/O)."""
        try:
            self.signature.bind(None, **kwargs)
        except TypeError as exc:
            raise PayloadError(
                f"task {self.name!r}: arguments do not match the handler: {exc}"
            ) from exc
        payload = encode_payload(kwargs, self.app.max_payload_bytes)
        if options.delay_s < 0:
            raise ConfigurationError("delay_s must be >= 0")
        operation_key = _key("operation_key", options.operation_key, self.operation_key, kwargs)
        resource_key = _key("resource_key", options.resource_key, self.resource_key, kwargs)
        dedup_key = (
            check_key(options.dedup_key, "dedup_key") if options.dedup_key is not None else None
        )
        window = self.dedup_window_s if options.dedup_window_s is None else options.dedup_window_s
        if window < 0:
            raise ConfigurationError("dedup_window_s must be >= 0")
        # `is None`, not `or`: an explicit empty name must be refused, not defaulted.
        queue = check_queue_name(self.queue if options.queue is None else options.queue)
        return JobSpec(
            task=self.name,
            queue=queue,
            payload=payload,
            max_attempts=self.policy.max_attempts,
            visibility_timeout_s=self.visibility_timeout_s
            or self.app.visibility_timeout_for(queue),
            priority=self.priority if options.priority is None else options.priority,
            delay_s=options.delay_s,
            operation_key=operation_key,
            resource_key=resource_key,
            lock_ttl_s=self.lock_ttl_s if resource_key else None,
            dedup_key=dedup_key,
            dedup_window_s=window,
        )


class BoundCall:
    """A task with per-call options applied; returned by :meth:`Task.options`."""

    def __init__(self, task: Task, options: CallOptions) -> None:
        self.task = task
        self.call_options = options

    def options(self, **changes: Any) -> BoundCall:
        """Change some options further."""
        return BoundCall(self.task, replace(self.call_options, **changes))

    def enqueue(self, /, *, connection: Any = None, **kwargs: Any) -> Job:
        """Schedule the task with these arguments and the bound options (see
        :meth:`Task.enqueue` for ``connection``)."""
        spec = self.task.build_spec(kwargs, self.call_options)
        return self.task.app.backend.enqueue(spec, connection=connection)
