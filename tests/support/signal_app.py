"""The app real worker processes run in the doctor's signal tests
(``tests.e2e.test_doctor_signal``), driven by marker files beside the store
(:func:`tests.support.stores.home_of`):

* ``mail`` renders, then sends in a step; while ``mailer-down`` exists the send raises and the
  handler swallows the error and returns (the job completes having sent nothing);
* ``slow`` runs ``run_s`` seconds on a 1 s lease kept alive by the heartbeat (a slow handler);
* ``steps`` runs three steps, a moment apart, so a worker killed or stopped under it is inside
  it; ``fragile`` does the same with a single delivery allowed (a crash buries it).
"""

from __future__ import annotations

import time

from jobguard import App, Context
from tests.support import stores

MAIL = "mail"
SLOW = "slow"
STEPS = "steps"
FRAGILE = "fragile"


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

    return app
