"""Retention: old completed jobs go, the idempotency records stay (G4.3)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from jobguard import App, Context, JobStatus, Outcome
from jobguard.cli.main import cli
from jobguard.testing import drain


def test_a_duplicate_after_pruning_is_still_acked_as_already_processed(app: App) -> None:
    """Pruning deletes the job rows, not the operation record: the effect is not redone."""
    runs: list[int] = []

    @app.task(operation_key="invoice:{order_id}")
    def invoice(ctx: Context, order_id: int) -> None:
        runs.append(order_id)

    first = invoice.enqueue(order_id=5)
    drain(app)
    assert app.prune(0) == 1
    assert app.jobs() == []

    again = invoice.enqueue(order_id=5)
    drain(app)
    assert runs == [5]
    assert again.id != first.id
    assert [a.outcome for a in app.attempts(job_id=again.id)] == [Outcome.ALREADY_PROCESSED]


def test_prune_command_reports_what_it_deleted(store_url: str) -> None:
    """``jobguard --url … prune --older-than-s N`` works without the app; bad ages are usage
    errors."""
    app = App(store_url)

    @app.task()
    def noop(ctx: Context) -> None: ...

    noop.enqueue()
    drain(app)
    app.close()
    runner = CliRunner()
    kept = runner.invoke(cli, ["--url", store_url, "prune", "--older-than-s", "3600"])
    assert (kept.exit_code, kept.output.strip()) == (0, "pruned 0 completed jobs")
    pruned = runner.invoke(cli, ["--url", store_url, "prune", "--older-than-s", "0"])
    assert (pruned.exit_code, pruned.output.strip()) == (0, "pruned 1 completed job")
    after = App(store_url)
    assert after.counts()[JobStatus.COMPLETED] == 0
    after.close()
    bad = runner.invoke(cli, ["--url", store_url, "prune", "--older-than-s", "-1"])
    assert bad.exit_code == 2


def test_a_worker_with_a_retention_prunes_completed_jobs_as_it_runs(store_url: str) -> None:
    """``retention_s`` on the worker: completed jobs leave the store while the worker runs,
    their operation records stay; a bad retention is refused where it is given."""
    import threading

    from jobguard import ConfigurationError
    from tests.support.procs import wait_until

    app = App(store_url)

    @app.task(operation_key="receipt:{n}")
    def receipt(ctx: Context, n: int) -> None:
        """Nothing to do."""

    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ConfigurationError, match="retention_s"):
            app.worker(retention_s=bad)
    for n in range(5):
        receipt.enqueue(n=n)
    worker = app.worker(retention_s=0.0, install_signal_handlers=False, grace_s=1.0)
    runner = threading.Thread(target=worker.run, daemon=True)
    runner.start()
    try:
        wait_until(lambda: sum(app.counts().values()) == 0 and len(app.attempts()) == 0, 20)
    finally:
        worker.stop()
        runner.join(timeout=20)
    assert worker.stats.outcomes == {Outcome.COMPLETED: 5}
    assert all(app.operation(f"receipt:{n}") is not None for n in range(5))
    app.close()
