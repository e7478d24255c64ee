"""Work taken from a hand-over queue, with the store connection kept while work keeps coming.

A worker's handler threads and its settler each keep one store connection between their calls
(:meth:`~jobguard.backends.base.QueuePort.keep_connection`). A thread that waits for work gives
its connection back once nothing came for :data:`KEEP_IDLE_S`, so an idle worker holds no more
connections than it did when each call took one, and takes one again with its next piece of work.
"""

from __future__ import annotations

import queue as queue_module
from collections.abc import Callable, Generator
from contextlib import AbstractContextManager
from typing import TypeVar

T = TypeVar("T")

# How long a thread waits for work while it keeps its connection.
KEEP_IDLE_S = 1.0


def kept_while_busy(
    source: queue_module.SimpleQueue[T], keep: Callable[[], AbstractContextManager[None]]
) -> Generator[T, None, None]:
    """Yield ``source``'s items as they come, inside ``keep()`` from an item's arrival until
    none came for :data:`KEEP_IDLE_S`. Close the iterator when done with it (``closing``): a
    connection kept is given back then, on the thread that kept it."""
    while True:
        item = source.get()
        with keep():
            while True:
                yield item
                try:
                    item = source.get(timeout=KEEP_IDLE_S)
                except queue_module.Empty:
                    break
