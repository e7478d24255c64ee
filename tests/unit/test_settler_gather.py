"""How the settler gathers a batch: it waits a moment for the endings of handlers still running
(they then share one commit), asleep rather than on the queue, and never waits when none runs or
the batch is full."""

from __future__ import annotations

import queue
import threading
import time

from jobguard.settler import _STOP, gather

LONG_S = 30.0  # a linger no passing test waits out


def put_later(
    source: queue.SimpleQueue[object], item: object, after: threading.Event
) -> threading.Thread:
    """Put ``item`` a while after ``after`` is set: long after a gather that does not wait would
    have returned."""

    def put() -> None:
        after.wait(5.0)
        time.sleep(0.2)
        source.put(item)

    thread = threading.Thread(target=put)
    thread.start()
    return thread


def test_an_ending_that_comes_while_handlers_run_joins_the_batch() -> None:
    source: queue.SimpleQueue[object] = queue.SimpleQueue()
    asked = threading.Event()

    def running() -> int:
        asked.set()  # the gather looks for more: now the second handler ends
        return 1

    putter = put_later(source, "second", asked)
    batch, stopping = gather(source, "first", running, LONG_S, limit=2)
    putter.join()
    assert (batch, stopping) == (["first", "second"], False)


def test_with_no_handler_running_it_takes_only_what_is_there() -> None:
    source: queue.SimpleQueue[object] = queue.SimpleQueue()
    source.put("second")
    batch, stopping = gather(source, "first", lambda: 0, LONG_S)
    assert (batch, stopping) == (["first", "second"], False)  # returned without the linger


def test_a_full_batch_does_not_wait() -> None:
    source: queue.SimpleQueue[object] = queue.SimpleQueue()
    for item in ("second", "third"):
        source.put(item)
    batch, _ = gather(source, "first", lambda: 1, LONG_S, limit=2)
    assert batch == ["first", "second"]
    assert source.get_nowait() == "third"  # left for the next batch


def test_the_stop_mark_ends_the_batch_and_says_so() -> None:
    source: queue.SimpleQueue[object] = queue.SimpleQueue()
    source.put(_STOP)
    source.put("after the stop")
    assert gather(source, "first", lambda: 1, LONG_S) == (["first"], True)


class WatchedQueue(queue.SimpleQueue[object]):
    """A queue that counts the gets that could block (a thread waiting on it, woken by a put)."""

    blocking_gets = 0

    def get(self, block: bool = True, timeout: float | None = None) -> object:
        if block:
            self.blocking_gets += 1
        return super().get(block, timeout)


def test_it_lingers_asleep_so_an_ending_put_meanwhile_wakes_no_one() -> None:
    source = WatchedQueue()
    asked = threading.Event()

    def running() -> int:
        asked.set()
        return 1

    putter = put_later(source, "second", asked)
    batch, _ = gather(source, "first", running, LONG_S, limit=2)
    putter.join()
    assert batch == ["first", "second"]
    assert source.blocking_gets == 0
