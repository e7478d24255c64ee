"""Async tasks the shutdown tests run in real worker processes (``tests.support.async_app``).

* ``waits(n)``: awaits far longer than any grace period (a well-behaved coroutine).
* ``blocks(n, block_s)``: blocks the worker's event loop with a plain ``time.sleep`` for
  ``block_s`` seconds, as careless async code does, then awaits.

Both record ``started`` first (``tests.support.jsonl_events``), so a test signals the worker
only once they run.
"""

from __future__ import annotations

import asyncio
import time

from jobguard import App, Context
from tests.support import jsonl_events

WAITS = "waits"
BLOCKS = "blocks"
SYNC_WAITS = "sync_waits"


def make_app(url: str) -> App:
    """The async shutdown tasks on the store at ``url``."""
    app = App(url)

    @app.task(name=WAITS, visibility_timeout_s=30.0)
    async def waits(ctx: Context, n: int) -> None:
        jsonl_events.append(url, job=ctx.job_id, what="started")
        await asyncio.sleep(600)

    @app.task(name=BLOCKS, visibility_timeout_s=30.0)
    async def blocks(ctx: Context, n: int, block_s: float) -> None:
        jsonl_events.append(url, job=ctx.job_id, what="started")
        time.sleep(block_s)  # blocks the loop: what this test is about
        await asyncio.sleep(600)

    @app.task(name=SYNC_WAITS, visibility_timeout_s=30.0)
    def sync_waits(ctx: Context, n: int) -> None:
        jsonl_events.append(url, job=ctx.job_id, what="started")
        time.sleep(600)

    return app
