"""The app of the crash-loop test (``--app tests.support.crash_app``).

``decode(n)`` stands for a job whose delivery kills the worker process (a native decoder
crash, the OOM killer): for ``n == CULPRIT`` it SIGKILLs its own process on every attempt; any
other ``n`` works for ``WORK_S`` (so it is in flight beside the culprit when that one crashes)
and completes. Both record ``start`` (``tests.support.jsonl_events``).
"""

from __future__ import annotations

import os
import signal
import time

from jobguard import App, Context
from tests.support import jsonl_events

DECODE = "decode"
CULPRIT = 0
WORK_S = 0.6
LEASE_S = 1.0
MAX_ATTEMPTS = 4


def make_app(url: str) -> App:
    """The crash-loop task on the store at ``url``."""
    app = App(url)

    @app.task(name=DECODE, visibility_timeout_s=LEASE_S, max_attempts=MAX_ATTEMPTS)
    def decode(ctx: Context, n: int) -> None:
        jsonl_events.append(url, job=ctx.job_id, attempt=ctx.attempt, n=n, what="start")
        if n == CULPRIT:
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(WORK_S)

    return app
