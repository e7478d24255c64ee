"""A backend for Django's tasks framework: ``@task`` functions run with jobguard's guarantees.

Works with ``django.tasks`` (Django 6) and with its backport ``django_tasks``::

    TASKS = {"default": {"BACKEND": "jobguard.contrib.django.tasks.JobguardBackend"}}
    JOBGUARD = {"APP": "shop.jobs:app"}   # the App the workers run (manage.py jobguard worker)

    @task()
    @guarded(operation_key="ship:{order_id}", resource_key="order:{order_id}")
    def ship(order_id: int) -> int:
        ctx = current_context()            # jobguard's Context: steps, db_step, idempotency keys
        return ctx.db_step("ship", record_shipment, order_id, on=DjangoSteps())

``ship.enqueue(order_id=7)`` inside ``transaction.atomic()`` on the store's database is written in
that transaction (the job exists if and only if it commits). Options the framework cannot
express (operation, resource and concurrency keys) come from :func:`guarded` on the same
function.
"""

from __future__ import annotations

import datetime as dt
import importlib
import inspect
import json
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from django.db import connections
from django.utils import timezone
from django.utils.module_loading import import_string

from jobguard.contrib.django.store import store_alias
from jobguard.core import checks
from jobguard.core.keys import render_key
from jobguard.exceptions import ConfigurationError, NotFoundError
from jobguard.models import Job, JobStatus

try:  # Django 6
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import (
        TaskContext,
        TaskError,
        TaskResult,
        TaskResultStatus,
    )
    from django.tasks.exceptions import TaskResultDoesNotExist
except ImportError:  # the backport, on older Django
    from django_tasks.backends.base import BaseTaskBackend
    from django_tasks.base import TaskContext, TaskError, TaskResult, TaskResultStatus
    from django_tasks.exceptions import TaskResultDoesNotExist

if TYPE_CHECKING:
    from jobguard.app import App
    from jobguard.context import Context

F = TypeVar("F", bound=Callable[..., Any])
DISPATCH = "jobguard.contrib.django.tasks"
_STATUS = {
    JobStatus.QUEUED: TaskResultStatus.READY,
    JobStatus.RUNNING: TaskResultStatus.RUNNING,
    JobStatus.COMPLETED: TaskResultStatus.SUCCESSFUL,
    JobStatus.DEAD: TaskResultStatus.FAILED,
}
_running = threading.local()


def guarded(
    *,
    operation_key: str | None = None,
    resource_key: str | None = None,
    concurrency_key: str | None = None,
    concurrency_limit: int | None = None,
) -> Callable[[F], F]:
    """jobguard's options for a Django task function (put it under ``@task()``).

    Args:
        operation_key: The operation's key template, e.g. ``"ship:{order_id}"``: steps are
            memoised under it, and a second job of the same operation does not redo the work.
        resource_key: The resource locked while it runs (fenced writes), e.g.
            ``"order:{order_id}"``.
        concurrency_key: The key template whose runs share ``concurrency_limit`` slots, e.g.
            ``"carrier:{carrier}"``; given with ``concurrency_limit``.
        concurrency_limit: How many runs of one concurrency key may run at once (1 to 1000).
    """
    if (concurrency_key is None) != (concurrency_limit is None):
        raise ConfigurationError(
            "guarded(): concurrency_key and concurrency_limit are given together "
            f"(got concurrency_key={concurrency_key!r}, concurrency_limit={concurrency_limit!r})"
        )
    if concurrency_limit is not None:
        checks.concurrency_limit("concurrency_limit", concurrency_limit)

    def mark(fn: F) -> F:
        fn.__jobguard__ = {  # type: ignore[attr-defined]
            "operation_key": operation_key,
            "resource_key": resource_key,
            "concurrency_key": concurrency_key,
            "concurrency_limit": concurrency_limit,
        }
        return fn

    return mark


def current_context() -> Context:
    """jobguard's :class:`~jobguard.Context` of the Django task running on this thread."""
    ctx: Context | None = getattr(_running, "ctx", None)
    if ctx is None:
        raise ConfigurationError("current_context() is called only inside a running Django task")
    return ctx


def install(app: App) -> None:
    """Register the task that runs Django task functions on ``app`` (once; the backend and the
    app config call it, so a worker of ``app`` runs them)."""
    if DISPATCH in app.tasks:
        return

    def run_django_task(
        ctx: Context, path: str, arguments: dict[str, Any], takes_context: bool
    ) -> Any:
        task = import_string(path)
        _running.ctx = ctx
        try:
            if takes_context:
                result = _result(task, app.get_job(ctx.job_id), attempt=ctx.attempt)
                return task.call(TaskContext(task_result=result), **arguments)
            return task.call(**arguments)
        finally:
            _running.ctx = None

    app.task(name=DISPATCH)(run_django_task)


def project_app() -> App:
    """The App of ``JOBGUARD["APP"]`` (``"module:attr"``), with Django tasks installed."""
    from django.conf import settings

    path = getattr(settings, "JOBGUARD", {}).get("APP")
    if not path or ":" not in str(path):
        raise ConfigurationError(
            'the jobguard tasks backend needs JOBGUARD = {"APP": "module:attr"} naming your App'
        )
    module, _, attr = str(path).partition(":")
    app: App = getattr(importlib.import_module(module), attr)
    install(app)
    return app


class JobguardBackend(BaseTaskBackend):
    """Django's tasks on jobguard: retries, leases, operation keys, the DLQ, the attempt log."""

    supports_defer = True
    supports_get_result = True
    supports_priority = True
    supports_async_task = False

    def enqueue(self, task: Any, args: Any, kwargs: Any) -> Any:
        """Store a job for ``task(*args, **kwargs)``; in the store's ``atomic()`` block if any."""
        self.validate_task(task)
        arguments = _bound(task, list(args), dict(kwargs))
        options: dict[str, Any] = {"queue": task.queue_name, "priority": task.priority}
        marks = getattr(task.func, "__jobguard__", {})
        for name in ("operation_key", "resource_key", "concurrency_key"):
            if marks.get(name):
                options[name] = render_key(marks[name], arguments)
        if marks.get("concurrency_limit") is not None:
            options["concurrency_limit"] = marks["concurrency_limit"]
        if task.run_after is not None:
            options["delay_s"] = max(0.0, (task.run_after - timezone.now()).total_seconds())
        django_connection = connections[store_alias()]
        job = (
            project_app()
            .tasks[DISPATCH]
            .options(**options)
            .enqueue(
                path=task.module_path,
                arguments=arguments,
                takes_context=task.takes_context,
                connection=django_connection if django_connection.in_atomic_block else None,
            )
        )
        return _result(task, job, backend=self.alias)  # read in the caller's transaction

    def get_result(self, result_id: str) -> Any:
        """The task's state as jobguard stores it (its return value is not kept)."""
        app = project_app()
        try:
            job = app.get_job(int(result_id))
        except (ValueError, NotFoundError, ConfigurationError) as exc:
            raise TaskResultDoesNotExist(result_id) from exc
        if job.task != DISPATCH:
            raise TaskResultDoesNotExist(result_id)
        payload = json.loads(job.payload)
        return _result(import_string(payload["path"]), job, backend=self.alias)


def _bound(task: Any, args: list[Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The call's arguments by parameter name (jobguard's key templates name them)."""
    signature = inspect.signature(task.func)
    if task.takes_context:
        first = next(iter(signature.parameters))
        signature = signature.replace(
            parameters=[p for name, p in signature.parameters.items() if name != first]
        )
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError as exc:
        raise ConfigurationError(f"task {task.module_path}: {exc}") from exc
    return dict(bound.arguments)


def _result(task: Any, job: Job, *, attempt: int | None = None, backend: str = "default") -> Any:
    """A Django ``TaskResult`` of a stored job."""
    arguments = json.loads(job.payload)["arguments"]
    stamp = dt.datetime.fromtimestamp(job.created_at, tz=dt.UTC)
    finished = dt.datetime.fromtimestamp(job.finished_at, tz=dt.UTC) if job.finished_at else None
    errors = (
        [
            TaskError(
                exception_class_path="jobguard.exceptions.Fatal", traceback=job.last_error or ""
            )
        ]
        if job.status == JobStatus.DEAD
        else []
    )
    return TaskResult(
        task=task,
        id=str(job.id),
        status=_STATUS[job.status],
        enqueued_at=stamp,
        started_at=None,
        last_attempted_at=None,
        finished_at=finished,
        args=[],
        kwargs=arguments,
        backend=backend,
        errors=errors,
        worker_ids=[f"attempt-{n}" for n in range(1, (attempt or job.attempts) + 1)],
    )
