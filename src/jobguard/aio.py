"""The worker's event loop for ``async def`` handlers (guarantee G11).

One loop per worker, running on a thread of its own and started on the first async delivery.
A handler thread submits the handler's coroutine to it and waits for the result, so async jobs
keep everything sync jobs have: the delivery is leased and renewed by the heartbeat, its lock
and operation claim are taken by the pipeline before the coroutine starts, and its finish is
written by the same code. Store calls made from the coroutine (``ctx.step_async``,
``task.enqueue_async``) run on the loop's default executor, never on the loop itself.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Coroutine
from typing import Any

CLOSE_TIMEOUT_S = 10.0


class EventLoopThread:
    """An asyncio loop on a daemon thread: :meth:`run` a coroutine from any other thread."""

    def __init__(self, name: str = "jobguard-event-loop") -> None:
        self._name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._closed = False

    def _started(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._closed:
                raise RuntimeError("the worker's event loop is closed")
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name=self._name, daemon=True)
                thread.start()
                self._loop, self._thread = loop, thread
            return self._loop

    def run(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        """Run ``coroutine`` on the loop and return its result (or raise its exception)."""
        try:
            loop = self._started()
        except RuntimeError:
            coroutine.close()  # never awaited: say nothing about it at garbage collection
            raise
        future = asyncio.run_coroutine_threadsafe(_contained(coroutine), loop)
        try:
            result = future.result()
        except concurrent.futures.CancelledError:
            if not self._closed:
                raise
            # Cancelled by close(), at shutdown, after the worker handed its lease back: like a
            # sync handler still running when the worker exits, this delivery writes nothing
            # more (a late retry or refusal would overwrite the attempt's `released`). The
            # handler thread is a daemon: it waits here until the process ends.
            threading.Event().wait()
            raise AssertionError("unreachable") from None  # pragma: no cover
        if isinstance(result, _Exited):
            raise result.exc  # on the calling thread, which treats it as the job's failure
        return result

    def close(self) -> None:
        """Cancel what still runs on the loop, stop it and join its thread."""
        with self._lock:
            self._closed = True
            loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        future = asyncio.run_coroutine_threadsafe(_cancel_all(), loop)
        # A coroutine that ignores cancellation must not hold the worker's exit for ever.
        with contextlib.suppress(Exception):
            future.result(timeout=CLOSE_TIMEOUT_S)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=CLOSE_TIMEOUT_S)
        if thread.is_alive():
            return  # still blocked by a handler: the daemon thread ends with the process
        # A loop that was blocked past the timeout stopped with tasks left, the cancelling
        # one included (it would cancel the executor's shutdown): cancel them all here.
        leftover = list(asyncio.all_tasks(loop))
        for task in leftover:
            task.cancel()
        if leftover:
            loop.run_until_complete(asyncio.gather(*leftover, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_default_executor())
        loop.close()


class _Exited:
    """A coroutine raised SystemExit or KeyboardInterrupt: carried out as a value."""

    def __init__(self, exc: SystemExit | KeyboardInterrupt) -> None:
        self.exc = exc


async def _contained(coroutine: Coroutine[Any, Any, Any]) -> Any:
    """Await ``coroutine``; a SystemExit or KeyboardInterrupt it raises comes back as a value.

    Raised inside a task, asyncio lets those two escape the loop itself: the loop thread would
    stop, the caller would wait for ever and the job would stay running under a renewed lease.
    """
    try:
        return await coroutine
    except (SystemExit, KeyboardInterrupt) as exc:
        return _Exited(exc)


async def _cancel_all() -> None:
    current = asyncio.current_task()
    others = [task for task in asyncio.all_tasks() if task is not current]
    for task in others:
        task.cancel()
    await asyncio.gather(*others, return_exceptions=True)
