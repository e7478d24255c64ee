"""Tasks: a handler plus its queue, timeouts, retry policy and key templates."""

from __future__ import annotations

import asyncio
import inspect
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Protocol

from jobguard.backends.base import DeliveryRules
from jobguard.backends.sql.callers import for_thread
from jobguard.core import checks
from jobguard.core.calls import KeywordFit
from jobguard.core.jsonvalues import MAX_NESTING, too_deep
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

    def store_jobs(self, specs: Sequence[JobSpec], *, connection: Any = None) -> list[Job]:
        """Store validated jobs (with the app's hooks around the write)."""


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
    """Encode job arguments as canonical JSON (sorted keys), refusing non-JSON and oversize.

    Nesting is bounded (:data:`~jobguard.core.jsonvalues.MAX_NESTING` levels), so no payload
    that passes here makes a worker's JSON decoder run out of stack.
    """
    if too_deep(dict(arguments)):
        raise PayloadError(f"job arguments nest deeper than {MAX_NESTING} levels of lists/objects")
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
    """Per-call enqueue options; see :meth:`Task.options`. Numbers are checked when made."""

    dedup_key: str | None = None
    dedup_window_s: float | None = None
    delay_s: float = 0.0
    priority: int | None = None
    queue: str | None = None
    operation_key: str | None = None
    resource_key: str | None = None
    soft_time_limit_s: float | None = None
    time_limit_s: float | None = None
    concurrency_key: str | None = None
    concurrency_limit: int | None = None

    def __post_init__(self) -> None:
        """Refuse NaN, infinity, negative, out-of-range and non-numeric values, naming them."""
        set_field = object.__setattr__  # frozen: normalise in place once, here
        if self.concurrency_limit is not None:
            checks.concurrency_limit("concurrency_limit", self.concurrency_limit)
        set_field(self, "delay_s", checks.seconds("delay_s", self.delay_s))
        set_field(
            self, "dedup_window_s", checks.optional_seconds("dedup_window_s", self.dedup_window_s)
        )
        soft, hard = check_time_limits(self.soft_time_limit_s, self.time_limit_s)
        set_field(self, "soft_time_limit_s", soft)
        set_field(self, "time_limit_s", hard)
        if self.priority is not None:
            set_field(self, "priority", checks.priority("priority", self.priority))


def check_time_limits(soft: Any, hard: Any) -> tuple[float | None, float | None]:
    """A soft and a hard run-time limit: each ``None`` or a positive finite number of
    seconds, and the soft one below the hard one when both are given (the handler is told
    before it is stopped)."""
    soft = checks.optional_seconds("soft_time_limit_s", soft, positive=True)
    hard = checks.optional_seconds("time_limit_s", hard, positive=True)
    if soft is not None and hard is not None and soft >= hard:
        raise ConfigurationError(
            f"soft_time_limit_s ({soft:g}) must be less than time_limit_s ({hard:g}): the "
            "handler is told at the soft limit, before the hard one stops it"
        )
    return soft, hard


def call_options(**options: Any) -> CallOptions:
    """:class:`CallOptions` from keyword options, naming any option that does not exist."""
    known = {f.name for f in fields(CallOptions)}
    unknown = sorted(set(options) - known)
    if unknown:
        raise ConfigurationError(
            f"unknown enqueue option(s) {', '.join(unknown)} (known: {', '.join(sorted(known))})"
        )
    return CallOptions(**options)


def check_handler(name: str, fn: Callable[..., Any]) -> bool:
    """Refuse handlers that cannot work; return whether ``fn`` is a coroutine function.

    A generator (sync or async) would return an iterator without running its body, and a class
    or other non-function would be instantiated, not run: both are refused with the reason.
    """
    if not callable(fn) or isinstance(fn, type):
        raise ConfigurationError(f"task {name!r}: the handler must be a function, not {fn!r}")
    call = fn if inspect.isroutine(fn) else getattr(fn, "__call__", fn)  # noqa: B004
    if inspect.isgeneratorfunction(call) or inspect.isasyncgenfunction(call):
        raise ConfigurationError(
            f"task {name!r}: the handler is a generator function; calling it only creates an "
            "iterator and runs none of its body. Return a value instead of yielding it "
            "(a plain def or an async def)"
        )
    return inspect.iscoroutinefunction(call)


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
        soft_time_limit_s: float | None = None,
        time_limit_s: float | None = None,
        concurrency_key: str | None = None,
        concurrency_limit: int | None = None,
    ) -> None:
        if not isinstance(name, str) or not TASK_NAME.fullmatch(name):
            raise ConfigurationError(f"task name {name!r} is not valid")
        self.is_async = check_handler(name, fn)
        self.app = app
        self.fn = fn
        self.name = name
        self.queue = check_queue_name(queue)
        self.visibility_timeout_s = checks.optional_seconds(
            "visibility_timeout_s", visibility_timeout_s, positive=True
        )
        self.policy = policy
        self.priority = checks.priority("priority", priority)
        self.operation_key = operation_key
        self.resource_key = resource_key
        self.lock_ttl_s = checks.seconds("lock_ttl_s", lock_ttl_s, positive=True)
        self.concurrency_key = concurrency_key
        self.concurrency_limit = _limit_of(name, concurrency_key, concurrency_limit)
        self.max_defer_s = checks.seconds("max_defer_s", max_defer_s)
        self.dedup_window_s = checks.seconds("dedup_window_s", dedup_window_s)
        try:
            self.soft_time_limit_s, self.time_limit_s = check_time_limits(
                soft_time_limit_s, time_limit_s
            )
        except ConfigurationError as exc:
            raise ConfigurationError(f"task {name!r}: {exc}") from exc
        try:
            self.signature = inspect.signature(fn)
        except (TypeError, ValueError) as exc:
            raise ConfigurationError(f"task {name!r}: cannot read the handler's signature") from exc
        self.keyword_fit = KeywordFit(self.signature)
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
        templates = (
            ("operation_key", operation_key),
            ("resource_key", resource_key),
            ("concurrency_key", concurrency_key),
        )
        for what, template in templates:
            if template is None:
                continue
            if not isinstance(template, str):
                raise ConfigurationError(f"task {name!r}: {what} must be a template string")
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

    def delivery_rules(self) -> DeliveryRules:
        """What this definition gives each delivery: lease, attempt limit, lock length."""
        return DeliveryRules(self.visibility_timeout_s, self.policy.max_attempts, self.lock_ttl_s)

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
        soft_time_limit_s: float | None = None,
        time_limit_s: float | None = None,
        concurrency_key: str | None = None,
        concurrency_limit: int | None = None,
    ) -> BoundCall:
        """Per-call options, kept apart from the task's own arguments so names never clash.

        Args:
            dedup_key: Producer-side deduplication key (G6); an enqueue while a job holds it
                returns that job.
            dedup_window_s: Also hold the key this long after the job completes.
            delay_s: Do not run before this many seconds from now.
            priority: Higher runs first within a queue.
            queue: Override the task's queue.
            operation_key: A literal operation key for this call (instead of the template).
            resource_key: A literal resource key for this call (instead of the template).
            soft_time_limit_s: This call's soft run-time limit (instead of the task's).
            time_limit_s: This call's hard run-time limit (instead of the task's; enforced by
                process-mode workers only).
            concurrency_key: A literal concurrency key for this call (instead of the template);
                with the task's ``concurrency_limit`` or this call's.
            concurrency_limit: How many jobs of the concurrency key may run at once, for this
                call (instead of the task's).
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
                soft_time_limit_s=soft_time_limit_s,
                time_limit_s=time_limit_s,
                concurrency_key=concurrency_key,
                concurrency_limit=concurrency_limit,
            ),
        )

    def enqueue(self, /, *, connection: Any = None, **kwargs: Any) -> Job:
        """Schedule the task with these arguments; returns the stored (or deduplicated) job.

        With ``connection`` (your own open connection to the store's database: a psycopg
        connection on PostgreSQL, a pooled one included, a ``sqlite3`` connection to the store's
        file on SQLite, or a SQLAlchemy ``Connection`` or ``Session`` on either) the job is
        written in your transaction: it exists if and only if your transaction commits.
        """
        spec = self.build_spec(kwargs, CallOptions())  # refused before the store is opened
        return self.app.store_jobs([spec], connection=connection)[0]

    async def enqueue_async(self, /, *, connection: Any = None, **kwargs: Any) -> Job:
        """:meth:`enqueue` from async code: the store call runs on a thread, not the loop.

        ``connection`` is a connection whose transaction the job is written in: one that
        :meth:`enqueue` takes, or an asyncio one (a psycopg ``AsyncConnection``, an aiosqlite
        connection, a SQLAlchemy ``AsyncConnection`` or ``AsyncSession``), whose statements run
        on this loop while the enqueue awaits.
        """
        connection = await for_thread(connection)
        return await asyncio.to_thread(self.enqueue, connection=connection, **kwargs)

    def enqueue_many(
        self, arguments: Iterable[Mapping[str, Any]], *, connection: Any = None
    ) -> list[Job]:
        """Schedule one job per argument mapping, all in one transaction (all or none).

        ``connection`` as in :meth:`enqueue`.
        """
        specs = [self.build_spec(kwargs, CallOptions()) for kwargs in arguments]
        return self.app.store_jobs(specs, connection=connection) if specs else []

    async def enqueue_many_async(
        self, arguments: Iterable[Mapping[str, Any]], *, connection: Any = None
    ) -> list[Job]:
        """:meth:`enqueue_many` from async code: the store call runs on a thread, not the loop.

        ``connection`` as in :meth:`enqueue_async`.
        """
        batch = list(arguments)  # an iterator is read here, on the loop, not on the thread
        connection = await for_thread(connection)
        return await asyncio.to_thread(self.enqueue_many, batch, connection=connection)

    def build_spec(self, kwargs: Mapping[str, Any], options: CallOptions) -> JobSpec:
        """Validate arguments and options and build the :class:`JobSpec` (no I/O)."""
        mismatch = self.keyword_fit.mismatch(kwargs)
        if mismatch is not None:
            raise PayloadError(
                f"task {self.name!r}: arguments do not match the handler: {mismatch}"
            )
        payload = encode_payload(kwargs, self.app.max_payload_bytes)
        operation_key = _key("operation_key", options.operation_key, self.operation_key, kwargs)
        resource_key = _key("resource_key", options.resource_key, self.resource_key, kwargs)
        concurrency_key, concurrency_limit = self._concurrency(kwargs, options)
        dedup_key = (
            check_key(options.dedup_key, "dedup_key") if options.dedup_key is not None else None
        )
        window = self.dedup_window_s if options.dedup_window_s is None else options.dedup_window_s
        # `is None`, not `or`: an explicit empty name must be refused, not defaulted.
        queue = check_queue_name(self.queue if options.queue is None else options.queue)
        # Each limit of the call replaces the task's; the pair is checked again together.
        soft, hard = check_time_limits(
            self.soft_time_limit_s
            if options.soft_time_limit_s is None
            else options.soft_time_limit_s,
            self.time_limit_s if options.time_limit_s is None else options.time_limit_s,
        )
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
            lock_ttl_s=self.lock_ttl_s if resource_key or concurrency_key else None,
            dedup_key=dedup_key,
            dedup_window_s=window,
            soft_time_limit_s=soft,
            time_limit_s=hard,
            concurrency_key=concurrency_key,
            concurrency_limit=concurrency_limit,
        )

    def _concurrency(
        self, kwargs: Mapping[str, Any], options: CallOptions
    ) -> tuple[str | None, int | None]:
        """The concurrency key and limit of one call: a per-call option wins over the task's."""
        key = _key("concurrency_key", options.concurrency_key, self.concurrency_key, kwargs)
        limit = (
            self.concurrency_limit
            if options.concurrency_limit is None
            else options.concurrency_limit
        )
        if key is None and limit is not None:
            # A limit with nothing to count by would let every job run: refused, not ignored.
            raise ConfigurationError(
                f"task {self.name!r}: concurrency_limit needs a concurrency_key to count runs by"
            )
        if key is not None and limit is None:
            raise ConfigurationError(
                f"task {self.name!r}: concurrency_key {key!r} needs a concurrency_limit "
                "(how many of its jobs may run at once)"
            )
        return key, limit


def _limit_of(name: str, key: str | None, limit: Any) -> int | None:
    """A task's concurrency limit: a whole number of slots. A key needs one; a limit without a
    key waits for a per-call key (``task.options(concurrency_key=...)``)."""
    if limit is None:
        if key is not None:
            raise ConfigurationError(
                f"task {name!r}: concurrency_key needs a concurrency_limit "
                "(how many of its jobs may run at once)"
            )
        return None
    try:
        return checks.concurrency_limit("concurrency_limit", limit)
    except ConfigurationError as exc:
        raise ConfigurationError(f"task {name!r}: {exc}") from exc


class BoundCall:
    """A task with per-call options applied; returned by :meth:`Task.options`."""

    def __init__(self, task: Task, options: CallOptions) -> None:
        self.task = task
        self.call_options = options

    def options(self, **changes: Any) -> BoundCall:
        """Change some options further."""
        current = {f.name: getattr(self.call_options, f.name) for f in fields(CallOptions)}
        return BoundCall(self.task, call_options(**{**current, **changes}))

    def enqueue(self, /, *, connection: Any = None, **kwargs: Any) -> Job:
        """Schedule the task with these arguments and the bound options (see
        :meth:`Task.enqueue` for ``connection``)."""
        spec = self.task.build_spec(kwargs, self.call_options)
        return self.task.app.store_jobs([spec], connection=connection)[0]

    async def enqueue_async(self, /, *, connection: Any = None, **kwargs: Any) -> Job:
        """:meth:`enqueue` from async code (see :meth:`Task.enqueue_async` for ``connection``)."""
        connection = await for_thread(connection)
        return await asyncio.to_thread(self.enqueue, connection=connection, **kwargs)
