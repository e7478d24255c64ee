"""The app real worker processes run in the doctor's signal tests
(``tests.e2e.test_doctor_signal``), driven by marker files beside the store
(:func:`tests.support.stores.home_of`):

* ``mail`` renders, then sends in a step; while ``mailer-down`` exists the send raises and the
  handler swallows the error and returns (the job completes having sent nothing);
* ``slow`` runs ``run_s`` seconds on a 1 s lease kept alive by the heartbeat (a slow handler);
* ``steps`` runs three steps, a moment apart, so a worker killed or stopped under it is inside
  it; ``fragile`` does the same with a single delivery allowed (a crash buries it);
* ``frozen``: its first delivery records a step, then waits until its lease is lost (the test
  stops the worker past its lease meanwhile) before its next step, which is refused; later
  deliveries run straight through;
* ``limited`` always fails; its ``max_attempts`` is ``LIMITED_MAX_ATTEMPTS`` from the
  environment (2 by default), so a worker can run a newer definition than the producer's.
"""

from __future__ import annotations

import os
import time

from jobguard import App, Context
from tests.support import stores

MAIL = "mail"
SLOW = "slow"
STEPS = "steps"
FRAGILE = "fragile"
FROZEN = "frozen"
LIMITED = "limited"
WAIT_S = 30.0


class MailerDown(Exception):
    """The mail service did not answer."""


def make_app(url: str) -> App:
    """The signal tests' tasks on the store at ``url`` (SQLite or PostgreSQL)."""
    markers = stores.home_of(url)
    app = App(url)

    @app.task(name=MAIL, operation_key="mail:{user}")
    def mail(ctx: Context, user: int) -> None:
        ctx.step("render", lambda: f"hello {user}")

        def send() -> str:
            if (markers / "mailer-down").exists():
                raise MailerDown("the mail service did not answer")
            return f"sent-{user}"

        try:
            ctx.step("send", send)
        except MailerDown:
            return  # swallowed: the job completes without its mail

    @app.task(name=SLOW, operation_key="slow:{n}", visibility_timeout_s=1.0)
    def slow(ctx: Context, n: int, run_s: float) -> None:
        time.sleep(run_s)

    @app.task(name=STEPS, operation_key="steps:{n}", visibility_timeout_s=2.0)
    def steps(ctx: Context, n: int) -> None:
        for name in ("reserve", "charge", "ship"):
            ctx.step(name, lambda: n)
            time.sleep(0.2)

    @app.task(name=FRAGILE, operation_key="fragile:{n}", visibility_timeout_s=2.0, max_attempts=1)
    def fragile(ctx: Context, n: int) -> None:
        steps(ctx, n)

    @app.task(name=FROZEN, operation_key="frozen:{n}", visibility_timeout_s=2.0)
    def frozen(ctx: Context, n: int) -> None:
        ctx.step("reserve", lambda: n)
        deadline = time.monotonic() + WAIT_S
        while ctx.attempt == 1 and not ctx.lease_lost and time.monotonic() < deadline:
            time.sleep(0.01)
        ctx.step("ship", lambda: n)

    @app.task(
        name=LIMITED,
        max_attempts=int(os.environ.get("LIMITED_MAX_ATTEMPTS", "2")),
        backoff_base_s=0.01,
        backoff_cap_s=0.02,
        poison_threshold=100,
    )
    def limited(ctx: Context, n: int) -> None:
        raise ConnectionError(f"job {n}: the service did not answer")

    return app
