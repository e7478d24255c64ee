"""Fault injection around a user's own handler: prove it is duplicate-safe (the test kit).

Each method enqueues one job of the user's task, runs it through real workers on the kit's store
while injecting one fault of the article's list, runs the queues until idle, and then asserts,
through the store, that the job's work ended once and that ``effects()`` (the user's own count of
what the handler did: rows, mails sent) is what one run does. A handler that is not guarded fails
with :class:`DuplicateEffects`.

The faults are real: a crash is a forked worker process that dies (``os._exit``) right after a
step is recorded; a lost lease is a paused handler whose lease and lock expire on the store clock
while a second worker runs the job; a dropped connection is the store's own PostgreSQL
connection cut by the server in the middle of a ``db_step`` or ``db_writes`` transaction.
"""

from __future__ import annotations

import contextlib
import os
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from jobguard.hooks import HookChain, Hooks
from jobguard.models import Delivery, JobStatus

if TYPE_CHECKING:
    from jobguard.app import App
    from jobguard.steptx import StepCall, StepTransactions
    from jobguard.task import Task
    from jobguard.testing import ControlledClock

CRASHED = 86  # the exit status of a worker process the kit killed on purpose
_NEVER_REACHED = 87
_WAIT_S = 60.0


class DuplicateEffects(AssertionError):
    """A fault made the handler's effects happen a different number of times than once."""


class FaultNotReached(AssertionError):
    """The fault could not be injected: the handler never reached the step it names."""


class _StepFault(Hooks):
    """Calls ``action`` once, right after the ``after``-th step of a delivery is recorded."""

    def __init__(self, after: int, action: Callable[[Delivery], None]) -> None:
        self.after = after
        self.action = action
        self.seen = 0
        self.fired = threading.Event()

    @contextlib.contextmanager
    def running_step(self, delivery: Delivery, name: str) -> Iterator[None]:
        yield  # the step ran and its record is written when this block ends normally
        self.seen += 1
        if self.seen == self.after and not self.fired.is_set():
            self.fired.set()
            self.action(delivery)


class Faults:
    """Fault injection around the tasks of ``app`` (an app on the kit's store and clock).

    Args:
        app: The user's application, built on the kit's store: ``App(backend=store.backend)``.
        clock: The store clock of that backend (advanced to expire leases, locks, backoff).
    """

    def __init__(self, app: App, clock: ControlledClock) -> None:
        from jobguard.exceptions import ConfigurationError

        if app.backend.now() != clock():  # the kit moves leases and backoff on its own clock
            raise ConfigurationError(
                "the faults need the app on the kit's store and clock: "
                "App(backend=jobguard_store.backend)"
            )
        self.app = app
        self.clock = clock

    # -- running --------------------------------------------------------------------------------

    def run_until_idle(self, *, max_rounds: int = 200) -> dict[JobStatus, int]:
        """Run workers until no job is queued or running, moving the clock over any backoff."""
        for _ in range(max_rounds):
            self._worker().run(burst=True)
            counts = self.app.counts()
            if counts[JobStatus.QUEUED] == 0 and counts[JobStatus.RUNNING] == 0:
                return counts
            self.clock.advance(self._wait_ahead())
        raise AssertionError(f"the queues did not settle in {max_rounds} rounds: {counts}")

    def _wait_ahead(self) -> float:
        """How far the clock must move for the next waiting job (or an expired lease)."""
        now = self.clock()
        ahead = [job.run_at - now for job in self.app.jobs(JobStatus.QUEUED, limit=1000)]
        running = self.app.jobs(JobStatus.RUNNING, limit=1000)
        if running:  # a crashed worker's lease: it runs out after the lease length
            ahead.append(max(job.visibility_timeout_s for job in running) + 1.0)
        return max([0.001, *(a + 0.001 for a in ahead if a > 0)])

    def _worker(self, **options: Any) -> Any:
        return self.app.worker(
            concurrency=options.pop("concurrency", 1),
            install_signal_handlers=False,
            grace_s=1.0,
            poll_interval_s=0.01,
            **options,
        )

    @contextlib.contextmanager
    def _hooked(self, hook: Hooks) -> Iterator[None]:
        saved = self.app.hooks
        self.app.hooks = HookChain(saved, hook)
        try:
            yield
        finally:
            self.app.hooks = saved

    def _expect(self, what: str, effects: Callable[[], Any], expected: Any) -> None:
        self.run_until_idle()
        found = effects()
        if found != expected:
            raise DuplicateEffects(
                f"{what}: the handler's effects are {found!r}, one run's are {expected!r}"
            )
        dead = self.app.jobs(JobStatus.DEAD, limit=10)
        if dead:
            raise DuplicateEffects(f"{what}: job {dead[0].id} was buried: {dead[0].last_error}")

    # -- the faults -----------------------------------------------------------------------------

    def crash_after_step(
        self,
        task: Task,
        kwargs: Mapping[str, Any],
        *,
        step: int = 1,
        effects: Callable[[], Any],
        expected: Any = 1,
    ) -> None:
        """The worker process dies right after the ``step``-th step is recorded; another worker
        runs the job again once its lease runs out."""
        task.enqueue(**kwargs)
        with warnings.catch_warnings():
            # The child only runs a worker, whose store connections are opened anew per process.
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:  # the worker process that is going to die
            code = _NEVER_REACHED
            try:
                crash = _StepFault(step, lambda _delivery: os._exit(CRASHED))
                with self._hooked(crash):
                    self._worker(heartbeat=False).run(burst=True)
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        if os.waitstatus_to_exitcode(status) != CRASHED:
            raise FaultNotReached(f"the handler of {task.name!r} never completed step {step}")
        self._expect(f"crash after step {step}", effects, expected)

    def run_twice_concurrently(
        self,
        task: Task,
        kwargs: Mapping[str, Any],
        *,
        effects: Callable[[], Any],
        expected: Any = 1,
    ) -> None:
        """The same job enqueued twice (a duplicate webhook), both run at once by two threads."""
        task.enqueue(**kwargs)
        task.enqueue(**kwargs)
        self._worker(concurrency=2).run(burst=True)
        self._expect("the same job run twice concurrently", effects, expected)

    def lease_expires_mid_handler(
        self,
        task: Task,
        kwargs: Mapping[str, Any],
        *,
        after_step: int = 1,
        effects: Callable[[], Any],
        expected: Any = 1,
    ) -> None:
        """The handler pauses after step ``after_step``; its lease and lock expire and a second
        worker runs the job to the end; then the first handler goes on."""
        job = task.enqueue(**kwargs)
        resume = threading.Event()
        pause = _StepFault(after_step, lambda _delivery: _wait(resume))
        # A paused handler must not renew its lease: the heartbeat is off for this worker.
        first = threading.Thread(
            target=lambda: self._worker(heartbeat=False).run(burst=True),
            name="jobguard-paused",
            daemon=True,
        )
        with self._hooked(pause):  # the second worker's steps count on, so it never pauses
            first.start()
            try:
                if not pause.fired.wait(_WAIT_S):
                    raise FaultNotReached(
                        f"the handler of {task.name!r} never completed step {after_step}"
                    )
                stored = self.app.get_job(job.id)
                self.clock.advance(max(stored.visibility_timeout_s, stored.lock_ttl_s or 0) + 1)
                self.run_until_idle()
            finally:
                resume.set()
                first.join(_WAIT_S)
        self._expect(f"the lease expiring after step {after_step}", effects, expected)

    def redeliver_after_completion(
        self,
        task: Task,
        kwargs: Mapping[str, Any],
        *,
        effects: Callable[[], Any],
        expected: Any = 1,
    ) -> None:
        """The job completes, then the same message arrives again (a redelivery or a retried
        webhook) and is run too."""
        task.enqueue(**kwargs)
        self.run_until_idle()
        task.enqueue(**kwargs)
        self._expect("a redelivery after completion", effects, expected)

    def drop_connection_in_db_step(
        self,
        task: Task,
        kwargs: Mapping[str, Any],
        *,
        step: int = 1,
        effects: Callable[[], Any],
        expected: Any = 1,
    ) -> None:
        """The store connection is lost inside the ``step``-th ``db_step``, after its function
        ran and before the transaction commits; the job is retried.

        On PostgreSQL the server cuts the connection (``pg_terminate_backend``); on SQLite,
        which has no connection to cut, the transaction fails there with the error a lost
        store raises, so it rolls back the same way.
        """
        backend: Any = self.app.backend
        postgres = backend.driver.dialect == "postgres"

        def dropping(original: Callable[..., Any]) -> Callable[..., Any]:
            def db_step(guard: Any, key: str, name: str, fn: Any, args: Any, on: Any = None) -> Any:
                if on is not None:  # the step runs on a framework's connection: cut that one
                    return original(guard, key, name, fn, args, _Dropping(on, backend, postgres))

                def then_drop(conn: Any, *fn_args: Any) -> Any:
                    value = fn(conn, *fn_args)
                    if not postgres:
                        raise _lost()
                    _terminate(backend, conn.execute("SELECT pg_backend_pid()").fetchone()[0])
                    return value

                return original(guard, key, name, then_drop, args, on)

            return db_step

        self._fault_nth("db_step", step, dropping, task, kwargs, effects, expected)

    def drop_connection_in_db_writes(
        self,
        task: Task,
        kwargs: Mapping[str, Any],
        *,
        step: int = 1,
        effects: Callable[[], Any],
        expected: Any = 1,
    ) -> None:
        """The store connection is lost inside the ``step``-th ``db_writes``, after its step
        record was written and its statements ran, before the commit; the job is retried.

        On PostgreSQL the server process ends itself right after the statements, in the same
        round trip (``pg_terminate_backend(pg_backend_pid())``); on SQLite the transaction
        fails there with the error a lost store raises, so it rolls back the same way.
        """
        backend: Any = self.app.backend
        driver = backend.driver

        def dropping(original: Callable[..., Any]) -> Callable[..., Any]:
            def db_writes(guard: Any, key: str, name: str, statements: Any) -> Any:
                if driver.dialect == "postgres":
                    cut = ("SELECT pg_terminate_backend(pg_backend_pid())", None)
                    return original(guard, key, name, [*statements, cut])
                writer = threading.get_ident()
                write = driver.write

                def write_then_lose(fn: Callable[[Any], Any]) -> Any:
                    if threading.get_ident() != writer:  # another thread's write: untouched
                        return write(fn)

                    def then_lose(tx: Any) -> Any:
                        fn(tx)
                        raise _lost()

                    return write(then_lose)

                driver.write = write_then_lose
                try:
                    return original(guard, key, name, statements)
                finally:
                    del driver.write

            return db_writes

        self._fault_nth("db_writes", step, dropping, task, kwargs, effects, expected)

    def _fault_nth(
        self,
        method: str,
        step: int,
        faulted: Callable[[Callable[..., Any]], Callable[..., Any]],
        task: Task,
        kwargs: Mapping[str, Any],
        effects: Callable[[], Any],
        expected: Any,
    ) -> None:
        """Run one job of ``task`` with the store's ``method`` replaced, on its ``step``-th
        call, by ``faulted(original)``; then check its effects."""
        backend: Any = self.app.backend
        original = getattr(backend, method)
        fault = faulted(original)
        calls = {"n": 0}

        def call(*args: Any, **options: Any) -> Any:
            calls["n"] += 1
            return (fault if calls["n"] == step else original)(*args, **options)

        task.enqueue(**kwargs)
        setattr(backend, method, call)
        try:
            self.run_until_idle()
        finally:
            delattr(backend, method)
        if calls["n"] < step:
            raise FaultNotReached(f"the handler of {task.name!r} never ran {method} {step}")
        self._expect(f"the store connection dropped in {method} {step}", effects, expected)


def _lost() -> Exception:
    from jobguard.exceptions import StoreUnavailableError

    return StoreUnavailableError("the store connection was lost (injected)")


def _wait(event: threading.Event) -> None:
    event.wait(_WAIT_S)


def _terminate(backend: Any, pid: int) -> None:
    """Have the server cut the connection of server process ``pid``, from another one."""
    with backend.driver.connect() as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))


class _Dropping:
    """A framework's step transactions whose connection is lost right after the step function."""

    def __init__(self, inner: StepTransactions, backend: Any, postgres: bool) -> None:
        self.inner = inner
        self.backend = backend
        self.postgres = postgres

    @contextlib.contextmanager
    def transaction(self) -> Iterator[tuple[Any, StepCall]]:

        with self.inner.transaction() as (connection, call):

            def then_drop(fn: Callable[..., Any], args: Sequence[Any]) -> Any:
                value = call(fn, args)
                if not self.postgres:
                    raise _lost()
                _terminate(self.backend, connection.info.backend_pid)
                return value

            yield connection, then_drop
