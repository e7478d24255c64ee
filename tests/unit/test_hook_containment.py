"""Hooks that raise are contained by the one loop every hook call goes through."""

from __future__ import annotations

import logging
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

import pytest

from jobguard import App, Context, HookChain, Hooks, JobStatus
from jobguard.models import Delivery
from jobguard.testing import drain
from tests.support.exiting_app import BrokenHooks, BrokenOnExit


def test_a_hook_raising_from_every_method_is_logged_once_per_method_and_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    chain = HookChain(BrokenHooks(), BrokenOnExit())
    app = App(f"sqlite:///{tmp_path / 'jobs.db'}", hooks=chain)
    try:

        @app.task(operation_key="t:{n}", max_attempts=2, backoff_base_s=0.01, backoff_cap_s=0.02)
        def task(ctx: Context, n: int) -> int:
            value = int(ctx.step("one", lambda: n))
            if ctx.attempt == 1 and n == 0:
                raise ConnectionError("reset")
            return value

        with caplog.at_level(logging.ERROR, logger="jobguard.hooks"):
            jobs = [task.enqueue(n=n) for n in range(5)]
            counts = drain(app, timeout_s=30)
        assert counts[JobStatus.COMPLETED] == 5
        assert all(app.get_job(job.id).status == JobStatus.COMPLETED for job in jobs)
        assert app.hooks is chain
        told = [r.getMessage() for r in caplog.records if r.name == "jobguard.hooks"]
        assert len(told) == len(set(told))  # each hook and method once
        assert any("BrokenHooks.attempt_ended" in line for line in told)
        assert any("BrokenOnExit.delivering" in line for line in told)
        assert chain.failures > len(told)  # the others only counted
    finally:
        app.close()


def test_what_the_body_of_a_contained_hook_raises_goes_on_unchanged() -> None:
    """A hook failing as it is left is contained; the body's own error is not the hook's."""
    chain = HookChain(BrokenOnExit())
    with chain.running_step(None, "x"):  # type: ignore[arg-type]
        pass
    assert chain.failures == 1
    with pytest.raises(KeyError, match="mine"), chain.running_step(None, "x"):  # type: ignore[arg-type]
        raise KeyError("mine")
    assert chain.failures == 1


class _StepsSeen(Hooks):
    """Overrides one method only: still a hook to tell."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def running_step(self, delivery: Delivery, name: str) -> AbstractContextManager[None]:
        self.seen.append(name)
        return nullcontext()


def test_hooks_that_do_nothing_are_left_out_and_a_chain_of_none_is_silent(
    tmp_path: Path,
) -> None:
    """The default app's hooks do nothing: its chain is silent (each delivery skips building
    what it would tell); a hook overriding one method is kept, and told, among them."""
    assert HookChain(Hooks(), HookChain(Hooks())).silent
    assert App(f"sqlite:///{tmp_path / 'quiet.db'}").hooks.silent
    seen = _StepsSeen()
    chain = HookChain(Hooks(), seen)
    assert not chain.silent
    assert chain.hooks == (seen,)
    app = App(f"sqlite:///{tmp_path / 'jobs.db'}", hooks=chain)
    try:

        @app.task(operation_key="t:{n}")
        def task(ctx: Context, n: int) -> int:
            return int(ctx.step("one", lambda: n))

        task.enqueue(n=1)
        assert drain(app, timeout_s=30)[JobStatus.COMPLETED] == 1
        assert seen.seen == ["one"]
    finally:
        app.close()
