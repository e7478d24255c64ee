"""Reading the store never breaks on rows this version did not write (#18).

A newer jobguard may record an outcome or a dead code this one does not know; a hand-made fix, a
bad migration or another tool may leave an infinite duration, a timestamp far past year 9999,
or a result that is not JSON. ``jobs``, ``dlq list``, ``dlq show``, ``attempts`` and ``doctor``
(real processes, on both backends) show such rows as they are and exit 0; never 4, "a bug in
jobguard".
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from jobguard import App, Context, Outcome
from jobguard.testing import drain
from tests.e2e.test_cli import run_process
from tests.observability.conftest import Client, Served, served, start_cli
from tests.support import stores

FAR = 1e300
__all__ = ["served"]  # the fixture


def make_app(url: str) -> App:
    app = App(url)

    @app.task(name="boom", max_attempts=1, operation_key="boom:{n}")
    def boom(ctx: Context, n: int) -> None:
        ctx.step("prepare", lambda: n)
        raise ValueError(f"boom {n}")

    @app.task(name="fine", operation_key="fine:{n}")
    def fine(ctx: Context, n: int) -> int:
        return ctx.step("prepare", lambda: n)

    return app


@pytest.fixture
def foreign(store_url: str) -> App:
    """A store whose rows were then rewritten as another version or a careless hand would."""
    app = make_app(store_url)
    for n in range(3):
        app.tasks["boom"].enqueue(n=n)
        app.tasks["fine"].enqueue(n=n)
    drain(app)
    app.close()
    jobs, attempts = stores.table(store_url, "jobs"), stores.table(store_url, "attempts")
    operations, steps = stores.table(store_url, "operations"), stores.table(store_url, "steps")
    big = "1e300"
    infinite = "9e999" if stores.kind_of(store_url) == "sqlite" else "'Infinity'"
    stores.execute(
        store_url,
        [
            f"UPDATE {attempts} SET outcome = 'quarantined' WHERE job_id = 1",
            f"UPDATE {jobs} SET dead_code = 'parked' WHERE id = 3",
            f"UPDATE {attempts} SET duration_s = {infinite} WHERE job_id = 2",
            f"UPDATE {attempts} SET started_at = {big}, ended_at = {big} WHERE job_id = 4",
            f"UPDATE {jobs} SET created_at = {big}, finished_at = {big} WHERE id = 4",
            f"UPDATE {operations} SET result = 'not json' WHERE key = 'fine:1'",
            f"UPDATE {steps} SET result = '{{half' WHERE operation_key = 'fine:2'",
        ],
    )
    return App(store_url)


COMMANDS = [
    ["jobs"],
    ["jobs", "--json"],
    ["dlq", "list"],
    ["dlq", "show", "1"],
    ["dlq", "show", "3"],
    ["attempts", "--job", "1"],
    ["attempts", "--operation", "fine:1"],
    ["attempts", "--operation", "fine:2"],
    ["doctor"],
    ["doctor", "--json"],
]


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_commands_show_foreign_rows_and_exit_0(
    foreign: App, store_url: str, command: list[str], tmp_path: Path
) -> None:
    try:
        done = run_process(["--url", store_url, *command], tmp_path)
    finally:
        foreign.close()
    assert done.returncode in (0, 1), done.stderr  # doctor may find a problem: 1, never 4
    assert "a bug in jobguard" not in done.stderr
    assert "Traceback" not in done.stderr
    if command == ["attempts", "--job", "1"]:
        assert "quarantined" in done.stdout
    if command == ["dlq", "show", "3"]:
        assert "parked" in done.stdout
    if command[-1] == "--json":
        strict_json(done.stdout)


def strict_json(text: str) -> Any:
    """Parse ``text`` as JSON proper: Python's json also takes NaN and Infinity, JSON does not."""

    def refuse(constant: str) -> None:
        raise AssertionError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def test_jobs_json_shows_an_infinite_duration_as_null(
    foreign: App, store_url: str, tmp_path: Path
) -> None:
    try:
        done = run_process(["--url", store_url, "attempts", "--job", "2", "--json"], tmp_path)
    finally:
        foreign.close()
    assert done.returncode == 0, done.stderr
    assert [attempt["duration_s"] for attempt in strict_json(done.stdout)] == [None]


def test_the_api_reads_foreign_rows_as_they_are(foreign: App) -> None:
    try:
        [first] = foreign.attempts(job_id=1)
        assert first.outcome == "quarantined"
        assert first.outcome not in set(Outcome)
        dead = foreign.dlq.show(3)
        assert dead.job.dead_code == "parked"
        assert "parked" in dead.reason
        [infinite] = foreign.attempts(job_id=2)
        assert infinite.duration_s is not None
        assert infinite.duration_s > 1e308
        assert foreign.get_job(4).created_at == FAR
        not_json = foreign.operation("fine:1")
        assert not_json is not None
        assert not_json.result == "not json"
        half = foreign.operation("fine:2")
        assert half is not None
        assert half.steps == {"prepare": "{half"}
        foreign.diagnose()
    finally:
        foreign.close()


def test_the_dashboard_shows_foreign_rows(
    foreign: App, store_url: str, served: list[Served]
) -> None:
    """Served for real and read over HTTP: every page over those rows is a 200, not a 500."""
    foreign.close()
    proc = start_cli(store_url, ["--url", store_url, "dashboard", "--port", "0"], "dashboard at")
    served.append(proc)
    client = Client(proc.url)
    for path in [
        "/",
        "/jobs",
        "/jobs/1",
        "/jobs/2",
        "/jobs/3",
        "/jobs/4",
        "/dlq",
        "/operations?key=fine:1",
        "/operations?key=fine:2",
        "/doctor",
    ]:
        reply = client.request(path)
        assert reply.status == 200, (path, reply.body[-500:])
    assert "quarantined" in client.request("/jobs/1").body
