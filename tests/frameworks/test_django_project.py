"""A real small Django project (tests/frameworks/djangoproject) on SQLite and PostgreSQL: the store
is its database, migrated by `manage.py migrate` and `manage.py jobguard migrate`; a job enqueued
in `transaction.atomic()` on Django's connection exists iff it commits; a real worker process
(`manage.py jobguard worker --burst`) runs it and its db_step writes through the ORM once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import pg

PROJECT = Path(__file__).parent / "djangoproject"


@pytest.fixture(params=["sqlite", "postgres"])
def project_env(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JOBGUARD_", "SHOP_"))}
    env["DJANGO_SETTINGS_MODULE"] = "settings"
    env["PYTHONPATH"] = str(PROJECT.parents[2])  # fences.py uses the tests' port helpers
    if request.param == "sqlite":
        env["SHOP_SQLITE_FILE"] = str(tmp_path / "shop.db")
        yield env
        return
    url = pg.create_database()
    env["SHOP_PG_DATABASE"] = url.rsplit("/", 1)[1]
    yield env
    pg.drop_database(url)


def run(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [sys.executable, *args],
        cwd=PROJECT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, f"{args}: {done.stdout}\n{done.stderr}"
    return done.stdout


def test_enqueue_in_atomic_and_a_real_worker(project_env: dict[str, str]) -> None:
    run(project_env, "manage.py", "migrate", "-v", "0")  # Django's tables and jobguard's schema
    assert "already at schema version" in run(project_env, "manage.py", "jobguard", "migrate")
    printed = run(project_env, "scenario.py", "enqueue").splitlines()
    refused, rolled_back, committed = [json.loads(line) for line in printed]
    assert refused == {"refused": True}
    assert rolled_back == {"orders": 0, "jobs": 0}
    assert committed == {"orders": 1, "jobs": 1}
    run(project_env, "manage.py", "jobguard", "worker", "--burst")
    assert json.loads(run(project_env, "scenario.py", "check")) == {
        "status": "completed",
        "payments": 1,
        "paid": [1],
    }
    run(project_env, "manage.py", "jobguard", "doctor")
    assert "(0 shown)" in run(project_env, "manage.py", "jobguard", "dlq", "list")
    assert "--concurrency" in run(project_env, "manage.py", "jobguard", "worker", "--help")


def test_db_step_through_the_orm_against_the_guard(project_env: dict[str, str]) -> None:
    run(project_env, "manage.py", "migrate", "-v", "0")
    report = json.loads(run(project_env, "fences.py"))
    assert report.pop("commit") == {"ran": 1, "rows": 1, "raised": None}
    assert report.pop("again") == {"ran": 0, "rows": 0, "raised": None}
    assert report.pop("savepoint") == {"ran": 1, "rows": 1, "raised": None}
    assert report.pop("raises") == {"ran": 1, "rows": 0, "raised": "ValueError"}
    assert report.pop("stale") == {"ran": 0, "rows": 0, "raised": "StaleFenceError"}
    if "SHOP_PG_DATABASE" in project_env:  # the ORM write is rolled back with the refusal
        assert report.pop("taken-over") == {"ran": 1, "rows": 0, "raised": "StaleFenceError"}
    assert report == {}


def test_django_tasks_run_on_jobguard(project_env: dict[str, str]) -> None:
    """``@task`` functions (the django_tasks backport; ``django.tasks`` on Django 6) enqueued
    with ``.enqueue()``: in ``atomic()`` the job commits with it; the operation key of
    ``guarded`` makes a duplicate a no-op; real worker processes run them."""
    run(project_env, "manage.py", "migrate", "-v", "0")
    enqueued = json.loads(run(project_env, "scenario.py", "tasks"))
    assert enqueued["jobs"] == 2  # the rolled-back one left none
    run(project_env, "manage.py", "jobguard", "worker", "--burst")
    assert json.loads(run(project_env, "scenario.py", "task-results", *enqueued["ids"])) == {
        "status": ["SUCCESSFUL", "SUCCESSFUL"],
        "payments": [501],
    }


def test_a_django_tasks_concurrency_limit_holds_on_a_real_worker(
    project_env: dict[str, str],
) -> None:
    """``guarded(concurrency_key=, concurrency_limit=)`` reaches each job; a worker with two
    threads runs the two restocks one at a time (the second waits, uncharged, for the slot) and
    both complete. One option without the other, or a limit out of range, is refused where it
    is written."""
    run(project_env, "manage.py", "migrate", "-v", "0")
    limits = json.loads(run(project_env, "scenario.py", "limits"))
    assert limits["limits"] == [["dock", 1], ["dock", 1]]
    assert "given together" in limits["refused"][0]
    assert "concurrency_limit" in limits["refused"][1]
    assert len(limits["refused"]) == 2
    for _ in range(20):  # a burst worker leaves a job waiting for the slot to a later one
        run(project_env, "manage.py", "jobguard", "worker", "--burst", "--concurrency", "2")
        seen = json.loads(run(project_env, "scenario.py", "limit-results"))
        if seen["status"] == ["completed", "completed"]:
            break
    assert seen["status"] == ["completed", "completed"]
    assert seen["waits"]
    assert all(w.startswith("concurrency limit reached: 1 running for dock") for w in seen["waits"])
