"""Visibility timeouts per queue and per task (G2.3)."""

from __future__ import annotations

import pytest

from jobguard import App, ConfigurationError, Context
from tests.support.ports import fetch


def test_task_without_timeout_takes_its_queues_timeout_and_task_setting_wins(
    store_url: str,
) -> None:
    """G2.3: fast and slow jobs can live in separate queues with their own lease lengths."""
    app = App(store_url, queue_visibility_timeouts_s={"slow": 300})

    @app.task(queue="slow")
    def report(ctx: Context) -> None: ...

    @app.task(queue="slow", visibility_timeout_s=5)
    def ping(ctx: Context) -> None: ...

    assert report.enqueue().visibility_timeout_s == 300
    assert ping.enqueue().visibility_timeout_s == 5
    assert report.options(queue="fast").enqueue().visibility_timeout_s == 30
    delivery = fetch(app.backend, ["slow"], 1, "w")[0]
    assert delivery.lease_expires_at - app.backend.get_job(delivery.job_id).created_at >= 299
    app.close()


@pytest.mark.parametrize("timeouts", [{"slow": 0}, {"not a name": 10}])
def test_bad_queue_timeout_is_refused_when_the_app_is_built(timeouts: dict[str, float]) -> None:
    """A zero lease or a queue name that is not an identifier is a configuration error."""
    with pytest.raises(ConfigurationError):
        App("sqlite:///unused.db", queue_visibility_timeouts_s=timeouts)
