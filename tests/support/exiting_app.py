"""The app of the handler-exit and broken-hook tests: handlers that end their interpreter's way.

``make_app(url)`` serves ``tests.support.run_worker``. Its handlers raise ``SystemExit`` (by
``sys.exit()``, by ``argparse`` rejecting arguments, from an ``async def``) or
``KeyboardInterrupt`` on their first attempt and succeed on the second; ``always_exits`` never
succeeds. With ``EXITING_APP_BROKEN_HOOKS=1`` every hook method raises.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Iterator, Sequence
from typing import Any

from jobguard import App, Context, Hooks
from jobguard.models import Delivery, JobSpec

BROKEN_HOOKS_ENV = "EXITING_APP_BROKEN_HOOKS"
RULES: dict[str, Any] = {"max_attempts": 2, "backoff_base_s": 0.01, "backoff_cap_s": 0.02}


class BrokenHooks(Hooks):
    """A metrics or tracing hook gone wrong: every method raises, context managers included."""

    def __getattribute__(self, name: str) -> Any:
        if name.startswith("__"):
            return super().__getattribute__(name)
        raise RuntimeError(f"broken hook: {name}")


class BrokenOnExit(Hooks):
    """Context-manager hooks that enter fine and raise when they are left."""

    @contextlib.contextmanager
    def enqueuing(self, specs: Sequence[JobSpec]) -> Iterator[dict[str, str]]:
        yield {}
        raise RuntimeError("broken hook: enqueuing exit")

    @contextlib.contextmanager
    def delivering(self, delivery: Delivery) -> Iterator[None]:
        yield
        raise RuntimeError("broken hook: delivering exit")

    @contextlib.contextmanager
    def running_step(self, delivery: Delivery, name: str) -> Iterator[None]:
        yield
        raise RuntimeError("broken hook: running_step exit")


def make_app(url: str) -> App:
    """The app with ``exits``, ``rejects_arguments``, ``interrupts``, ``exits_async``,
    ``always_exits`` and ``plain`` (keyed, with a step)."""
    from jobguard import HookChain

    broken = os.environ.get(BROKEN_HOOKS_ENV) == "1"
    app = App(url, hooks=HookChain(BrokenHooks(), BrokenOnExit()) if broken else None)

    @app.task(name="exits", **RULES)
    def exits(ctx: Context, n: int) -> int:
        if ctx.attempt == 1:
            sys.exit(3)
        return n

    @app.task(name="rejects_arguments", **RULES)
    def rejects_arguments(ctx: Context, n: int) -> int:
        if ctx.attempt == 1:
            parser = argparse.ArgumentParser(prog="report")
            parser.add_argument("--month", required=True)
            with contextlib.redirect_stderr(open(os.devnull, "w")):
                parser.parse_args(["--nope"])
        return n

    @app.task(name="interrupts", **RULES)
    def interrupts(ctx: Context, n: int) -> int:
        if ctx.attempt == 1:
            raise KeyboardInterrupt
        return n

    @app.task(name="exits_async", **RULES)
    async def exits_async(ctx: Context, n: int) -> int:
        if ctx.attempt == 1:
            raise SystemExit(4)
        return n

    @app.task(name="always_exits", **RULES)
    def always_exits(ctx: Context, n: int) -> None:
        sys.exit(f"job {n} gives up")

    @app.task(name="plain", operation_key="plain:{n}", resource_key="plain:{n}", **RULES)
    def plain(ctx: Context, n: int) -> int:
        if n % 2 and ctx.attempt == 1:
            raise ConnectionError("upstream reset")
        return int(ctx.step("double", lambda: n * 2))

    return app
