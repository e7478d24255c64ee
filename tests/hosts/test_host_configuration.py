"""A guard that cannot keep its promise is refused where it is written (import or start),
with a message naming what is wrong, never at the first job; and jobguard without the host
packages imports and runs as before."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from dramatiq.brokers.stub import StubBroker
from dramatiq.middleware import Retries

import jobguard
from jobguard.exceptions import ConfigurationError, PayloadError, StoreUnavailableError
from jobguard.hosts.celery import CeleryGuard
from jobguard.hosts.dramatiq import DramatiqGuard
from jobguard.hosts.rq import RQGuard
from tests.support.procs import REPO_ROOT, clean_env


def handler(ctx: Any, order_id: int) -> None:
    """A guardable function."""


@pytest.fixture
def store(tmp_path: Path) -> jobguard.App:
    return jobguard.App(f"sqlite:///{tmp_path / 'jobs.db'}")


@pytest.fixture
def celery_guard(store: jobguard.App) -> CeleryGuard:
    # The broker is never reached: every refusal below happens before anything is sent.
    app = Celery("shop", broker="redis://127.0.0.1:6379/15")
    app.conf.broker_transport_options = {"visibility_timeout": 10}
    return CeleryGuard(app, store)


KEYS = {"operation_key": "fulfil-order:{order_id}"}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"acks_late": False}, "acks_late=False is refused: without it Celery acks before"),
        ({"reject_on_worker_lost": False}, "reject_on_worker_lost=False is refused"),
        ({"max_retries": 3}, "max_retries= is refused: jobguard counts attempts"),
        ({"autoretry_for": (OSError,)}, "autoretry_for= is refused"),
        ({"bind": True}, "bind= is refused"),
        ({"retry_backoff": True}, "retry_backoff= is refused"),
    ],
)
def test_celery_options_that_break_the_promise_are_refused_at_import(
    celery_guard: CeleryGuard, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message):
        celery_guard.task(**KEYS, **options)(handler)


def positional_only(ctx: Any, order_id: int, /) -> None:
    """Its argument cannot be stored by name."""


def star_args(ctx: Any, *order_ids: int) -> None:
    """Its arguments cannot be stored by name."""


def no_ctx() -> None:
    """No context to give it."""


@pytest.mark.parametrize(
    ("fn", "options", "message"),
    [
        (handler, {}, "needs operation_key="),
        (positional_only, KEYS, "argument 'order_id' cannot be guarded"),
        (star_args, KEYS, "argument 'order_ids' cannot be guarded"),
        (no_ctx, KEYS, "must take ctx"),
        (handler, {"operation_key": "order:{customer}"}, "names 'customer'"),
        (handler, {**KEYS, "lock_ttl_s": -1}, "lock_ttl_s"),
        (handler, {**KEYS, "max_attempts": 0}, "max_attempts"),
        (handler, {**KEYS, "dedup": True, "dedup_unsent_s": 0}, "dedup_unsent_s must be"),
        (handler, {**KEYS, "dedup_unsent_s": "soon"}, "dedup_unsent_s must be"),
        (handler, {**KEYS, "concurrency_key": "dock"}, "needs a concurrency_limit"),
        (handler, {**KEYS, "concurrency_key": "dock", "concurrency_limit": 0}, "concurrency_limit"),
        (handler, {**KEYS, "concurrency_key": "{dock}", "concurrency_limit": 1}, "names 'dock'"),
    ],
)
def test_functions_and_options_that_cannot_be_guarded_are_refused_on_every_host(
    celery_guard: CeleryGuard,
    store: jobguard.App,
    fn: Any,
    options: dict[str, Any],
    message: str,
) -> None:
    broker = StubBroker()
    makers = [
        celery_guard.task,
        RQGuard(store).job,
        DramatiqGuard(broker, store).actor,
    ]
    for make in makers:
        with pytest.raises(ConfigurationError, match=message):
            make(**options)(fn)


def test_a_guarded_task_sent_with_arguments_it_cannot_take_is_refused_at_the_producer(
    celery_guard: CeleryGuard,
) -> None:
    task = celery_guard.task(**KEYS)(handler)
    with pytest.raises(ConfigurationError, match="arguments do not match"):
        task.delay(customer=3)
    with pytest.raises(PayloadError, match="JSON"):
        task.delay(order_id=object())


def test_an_unreachable_store_is_refused_when_the_guard_is_made() -> None:
    celery_app = Celery("shop", broker="redis://127.0.0.1:6379/15")
    # Nothing listens on port 1.
    unreachable = jobguard.App("postgresql://postgres@127.0.0.1:1/shop?connect_timeout=2")
    with pytest.raises(StoreUnavailableError, match="cannot be used"):
        CeleryGuard(celery_app, unreachable)
    with pytest.raises(StoreUnavailableError, match="cannot be used"):
        RQGuard(unreachable)
    with pytest.raises(StoreUnavailableError, match="cannot be used"):
        DramatiqGuard(StubBroker(), unreachable)


def test_a_store_given_as_a_backend_object_is_refused(tmp_path: Path) -> None:
    from jobguard.backends import open_backend

    backend = open_backend(f"sqlite:///{tmp_path / 'jobs.db'}")
    try:
        with pytest.raises(ConfigurationError, match="needs the store as a URL"):
            RQGuard(jobguard.App(backend=backend))
    finally:
        backend.close()


def test_a_broken_visibility_timeout_is_refused(store: jobguard.App) -> None:
    celery_app = Celery("shop", broker="redis://127.0.0.1:6379/15")
    celery_app.conf.broker_transport_options = {"visibility_timeout": "soon"}
    with pytest.raises(ConfigurationError, match="visibility_timeout"):
        CeleryGuard(celery_app, store)


def test_a_dramatiq_broker_without_retries_is_refused(store: jobguard.App) -> None:
    broker = StubBroker(middleware=[])
    assert not any(isinstance(m, Retries) for m in broker.middleware)
    with pytest.raises(ConfigurationError, match="no Retries middleware"):
        DramatiqGuard(broker, store)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_retries": 3}, "max_retries= is refused"),
        ({"retry_when": lambda retries, exc: True}, "retry_when= is refused"),
        ({"throws": (ValueError,)}, "throws= is refused"),
        ({"min_backoff": 10}, "min_backoff= is refused"),
        ({"max_backoff": 10}, "max_backoff= is refused"),
        ({"time_limit": 0}, "time_limit must be a positive number of milliseconds"),
    ],
)
def test_dramatiq_options_that_break_the_promise_are_refused(
    store: jobguard.App, options: dict[str, Any], message: str
) -> None:
    guard = DramatiqGuard(StubBroker(), store)
    with pytest.raises(ConfigurationError, match=message):
        guard.actor(**KEYS, **options)(handler)


def test_rq_options_it_does_not_know_and_a_replay_queue_that_is_no_queue_are_refused(
    store: jobguard.App,
) -> None:
    with pytest.raises(ConfigurationError, match=r"unknown option\(s\) job_timeout"):
        RQGuard(store).job(**KEYS, job_timeout=30)(handler)
    with pytest.raises(ConfigurationError, match=r"replay_queue must be an rq\.Queue"):
        RQGuard(store, replay_queue="orders")  # type: ignore[arg-type]


def test_jobguard_imports_and_runs_without_any_host_package(tmp_path: Path) -> None:
    script = textwrap.dedent(
        """
        import sys

        class NoHosts:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("celery", "kombu", "rq", "dramatiq"):
                    raise ImportError(f"no module named {name!r}")
                return None

        sys.meta_path.insert(0, NoHosts())
        import jobguard
        import jobguard.cli.main

        app = jobguard.App("sqlite:///jobs.db")

        @app.task(operation_key="note:{n}")
        def note(ctx, n):
            return n

        note.enqueue(n=1)
        app.worker(install_signal_handlers=False).run(burst=True)
        assert app.counts()[jobguard.JobStatus.COMPLETED] == 1
        import importlib

        for host in ("celery", "rq", "dramatiq"):
            try:
                importlib.import_module(f"jobguard.hosts.{host}")
            except ImportError as exc:
                assert f"pip install 'jobguard[{host}]'" in str(exc), exc
            else:
                raise AssertionError(f"jobguard.hosts.{host} imported without its host")
        print("OK")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        env={**clean_env(), "PYTHONPATH": str(REPO_ROOT / "src")},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "OK"
