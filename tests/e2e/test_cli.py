"""The ``jobguard`` command line: every command and every documented error path.

Most tests drive the click command in-process with ``CliRunner`` against an app module written
into ``tmp_path``; the last ones run the installed ``jobguard`` entry point as a real process.
Exit codes are those of ``jobguard/cli/main.py``: 0 ok, 1 failed / not found, 2 usage, 3 store
unavailable.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from jobguard import App, JobStatus, Outcome
from jobguard.cli.main import COMMANDS, cli
from tests.support import stores
from tests.support.procs import clean_env, entry_point, wait_until

APP_SOURCE = '''
"""A small shop used by the CLI tests (its table is made by the test beside the store)."""
import time
from pathlib import Path

from jobguard import App, Context

app = App({url!r})


@app.task(name="charge", fatal=(ValueError,))
def charge(ctx: Context, order_id: int) -> None:
    if order_id < 0:
        raise ValueError(f"order id {{order_id}} is negative [red]not markup[/red]")


def record(conn, order_id, attempt):
    conn.execute({insert!r}, (order_id, attempt))


@app.task(
    name="fulfill",
    operation_key="fulfill-order:{{order_id}}",
    resource_key="order:{{order_id}}",
    queue="orders",
)
def fulfill(ctx: Context, order_id: int, wait_for: str = "") -> None:
    if wait_for:
        Path(wait_for + ".started").touch()  # the handler runs (fetched is not enough)
    deadline = time.monotonic() + 30
    while wait_for and not Path(wait_for).exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    ctx.db_step("record", record, order_id, ctx.attempt)
'''


@dataclass
class Shop:
    """An app module on disk and a task-less App on the same store for checking it."""

    module: str
    directory: Path
    url: str  # the ``--url`` value
    store: App

    @property
    def app_path(self) -> str:
        """The ``--app`` value."""
        return f"{self.module}:app"

    def fulfilled(self) -> list[tuple[int, int]]:
        """Rows the ``fulfill`` handler committed through ``ctx.db_step``."""
        fulfilled = stores.table(self.url, "fulfilled")
        return [
            (row[0], row[1])
            for row in stores.query(
                self.url, f"SELECT order_id, attempt FROM {fulfilled} ORDER BY order_id"
            )
        ]


@pytest.fixture
def shop(store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Shop]:
    """A uniquely named app module in ``tmp_path`` (the working directory), imported by --app,
    on a fresh store of each backend."""
    module = f"cli_shop_{uuid.uuid4().hex[:12]}"
    store = App(store_url)
    _ = store.backend  # the SQLite file exists before the business table goes into it
    fulfilled = stores.table(store_url, "fulfilled")
    stores.execute(
        store_url,
        [f"CREATE TABLE {fulfilled} (order_id INTEGER PRIMARY KEY, attempt INTEGER)"],
    )
    insert = stores.dialect_sql(
        store_url, f"INSERT INTO {fulfilled} (order_id, attempt) VALUES (?, ?)"
    )
    (tmp_path / f"{module}.py").write_text(APP_SOURCE.format(url=store_url, insert=insert))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))  # undone at teardown, with load_app's insert
    yield Shop(module, tmp_path, store_url, store)
    store.close()
    imported = sys.modules.pop(module, None)
    if imported is not None:
        imported.app.close()


def run(*args: str, input: str | None = None) -> Result:
    """Invoke the CLI in-process with separate stdout and stderr."""
    return CliRunner().invoke(cli, list(args), input=input, prog_name="jobguard")


def one_line_error(result: Result) -> str:
    """The single ``error: ...`` line a failing command printed on stderr."""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: "), result.stderr
    return lines[0]


def enqueue_args(shop: Shop, task: str, kwargs: str) -> list[str]:
    """The arguments of ``jobguard --app SHOP enqueue TASK --kwargs KWARGS``."""
    return ["--app", shop.app_path, "enqueue", task, "--kwargs", kwargs]


def burst(shop: Shop, *extra: str) -> Result:
    """``jobguard worker --burst`` in-process on every queue of the shop."""
    result = run("--app", shop.app_path, "worker", "--burst", "--queues", "default,orders", *extra)
    assert result.exit_code == 0, result.stderr
    return result


def run_process(
    args: list[str], cwd: Path, timeout_s: float = 60.0
) -> subprocess.CompletedProcess[str]:
    """Run the real ``jobguard`` executable (JOBGUARD_* scrubbed from its environment)."""
    env = clean_env()
    return subprocess.run(
        [*entry_point(), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


# -- enqueue ------------------------------------------------------------------------------------


def test_enqueue_prints_the_new_job_id_and_stores_its_arguments(shop: Shop) -> None:
    """`enqueue TASK --kwargs JSON` stores one job and prints its id (G1.1)."""
    result = run("--app", shop.app_path, "enqueue", "charge", "--kwargs", '{"order_id": 7}')

    assert result.exit_code == 0, result.stderr
    [job] = shop.store.jobs()
    assert result.stdout.strip() == f"job {job.id} enqueued: charge on queue default"
    assert json.loads(job.payload) == {"order_id": 7}
    assert job.status == JobStatus.QUEUED


def test_enqueue_reads_the_app_from_the_jobguard_app_environment_variable(shop: Shop) -> None:
    """JOBGUARD_APP stands in for --app, as the help text says."""
    result = CliRunner(env={"JOBGUARD_APP": shop.app_path}).invoke(
        cli, ["enqueue", "charge", "--kwargs", '{"order_id": 1}', "--json"]
    )

    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["id"] == shop.store.jobs()[0].id


def test_enqueue_with_a_held_dedup_key_returns_the_existing_job(shop: Shop) -> None:
    """A second enqueue with the same --dedup-key says deduplicated and stores nothing (G6.1)."""
    args = [
        *enqueue_args(shop, "charge", '{"order_id": 1}'),
        "--dedup-key",
        "charge:1",
    ]
    first = run(*args, "--json")
    second = run(*args)
    third = run(*args, "--json")

    assert first.exit_code == second.exit_code == third.exit_code == 0
    job_id = json.loads(first.stdout)["id"]
    assert json.loads(first.stdout)["deduplicated"] is False
    assert second.stdout.startswith(f"job {job_id} deduplicated")
    assert json.loads(third.stdout)["deduplicated"] is True
    assert json.loads(third.stdout)["id"] == job_id
    assert [job.id for job in shop.store.jobs()] == [job_id]


def test_enqueue_applies_delay_priority_queue_and_dedup_window(shop: Shop) -> None:
    """--delay-s, --priority, --queue and --dedup-window-s reach the stored job (G6.2)."""
    result = run(
        *enqueue_args(shop, "charge", '{"order_id": 2}'),
        "--delay-s",
        "60",
        "--priority",
        "9",
        "--queue",
        "urgent",
        "--dedup-key",
        "k",
        "--dedup-window-s",
        "300",
        "--json",
    )

    assert result.exit_code == 0, result.stderr
    shown = json.loads(result.stdout)
    job = shop.store.get_job(shown["id"])
    assert job.run_at - job.created_at == pytest.approx(60)
    assert (job.priority, job.queue, job.dedup_key) == (9, "urgent", "k")
    jobs = stores.table(shop.url, "jobs")
    [(window,)] = stores.query(
        shop.url, f"SELECT dedup_window_s FROM {jobs} WHERE id = ?", [job.id]
    )
    assert window == 300


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["enqueue", "charge", "--kwargs", '{"order_id": 1'], "not valid JSON"),
        (["enqueue", "charge", "--kwargs", "[1, 2]"], "must be a JSON object"),
        (["enqueue", "refund", "--kwargs", "{}"], "unknown task 'refund'"),
        (["enqueue", "charge", "--kwargs", '{"amount": 5}'], "do not match the handler"),
        (
            ["enqueue", "charge", "--kwargs", '{"order_id": 1}', "--queue", "a b"],
            "not a plain identifier",
        ),
        (["enqueue", "charge", "--kwargs", '{"order_id": 1}', "--delay-s", "-1"], "--delay-s"),
        (["enqueue", "fulfill", "--kwargs", '{"order_id": 1.5}'], "key parts must be"),
        (["enqueue", "charge", "--no-such-option"], "--no-such-option"),
        (["no-such-command"], "no-such-command"),
    ],
    ids=[
        "bad-json",
        "not-an-object",
        "unknown-task",
        "wrong-arguments",
        "bad-queue",
        "negative-delay",
        "unstable-key",
        "unknown-option",
        "unknown-command",
    ],
)
def test_bad_enqueue_arguments_are_one_line_usage_errors_and_store_nothing(
    shop: Shop, args: list[str], needle: str
) -> None:
    """Bad input is refused at the door with one line and exit 2."""
    result = run("--app", shop.app_path, *args)

    assert result.exit_code == 2, result.output
    assert needle in one_line_error(result)
    assert shop.store.jobs() == []


def test_enqueue_without_app_is_a_usage_error(shop: Shop) -> None:
    """enqueue needs the task definitions: without --app it says so in one line, exit 2."""
    result = run("--url", shop.url, "enqueue", "charge", "--kwargs", '{"order_id": 1}')

    assert result.exit_code == 2
    assert "needs --app" in one_line_error(result)


@pytest.mark.parametrize(
    ("app_path", "needle"),
    [("no_such_module_here:app", "cannot import"), ("nocolon", "module:attribute")],
)
def test_an_app_path_that_does_not_resolve_is_a_usage_error(
    shop: Shop, app_path: str, needle: str
) -> None:
    """--app that cannot be imported gives one line and exit 2, not a traceback."""
    result = run("--app", app_path, "jobs")

    assert result.exit_code == 2
    assert needle in one_line_error(result)


def test_an_app_path_naming_something_else_than_an_app_is_a_usage_error(shop: Shop) -> None:
    """--app module:attr must name a jobguard App."""
    result = run("--app", f"{shop.module}:charge", "jobs")

    assert result.exit_code == 2
    assert "is not a jobguard App" in one_line_error(result)


# -- jobs ---------------------------------------------------------------------------------------


def test_jobs_lists_a_table_and_json_filtered_by_status(shop: Shop) -> None:
    """`jobs` shows every job with counts; --status filters; --json is machine-readable."""
    run("--app", shop.app_path, "enqueue", "charge", "--kwargs", '{"order_id": 1}')
    run("--app", shop.app_path, "enqueue", "charge", "--kwargs", '{"order_id": -1}')
    run("--app", shop.app_path, "enqueue", "fulfill", "--kwargs", '{"order_id": 3}')
    burst(shop)

    table = run("--url", shop.url, "jobs")
    dead = run("--url", shop.url, "jobs", "--status", "dead", "--json")
    limited = run("--url", shop.url, "jobs", "--limit", "1", "--json")

    assert table.exit_code == dead.exit_code == limited.exit_code == 0
    assert "fulfill-order:3" in table.stdout
    assert "[/red]" in table.stdout  # stored text is printed as text, never as rich markup
    assert "queued 0  running 0  completed 2  dead 1" in table.stdout
    [dead_job] = json.loads(dead.stdout)
    assert dead_job["status"] == "dead"
    assert dead_job["dead_reason"].startswith("fatal error: ValueError")
    assert [job["id"] for job in json.loads(limited.stdout)] == [3]


def test_jobs_rejects_an_unknown_status_in_one_line(shop: Shop) -> None:
    """--status takes only the four job states (exit 2)."""
    result = run("--url", shop.url, "jobs", "--status", "finished")

    assert result.exit_code == 2
    assert "--status" in one_line_error(result)


# -- attempts -----------------------------------------------------------------------------------


def test_attempts_show_the_r8_1_fields_by_job_and_by_operation(shop: Shop) -> None:
    """`attempts --job` / `--operation` print the attempt log with G10.1 metadata (G10.1)."""
    run("--app", shop.app_path, "enqueue", "fulfill", "--kwargs", '{"order_id": 5}')
    burst(shop, "--worker-id", "cli-worker-1")

    by_job = run("--url", shop.url, "attempts", "--job", "1", "--json")
    by_op = run("--url", shop.url, "attempts", "--operation", "fulfill-order:5", "--json")
    table = run("--url", shop.url, "attempts", "--job", "1")

    assert by_job.exit_code == by_op.exit_code == table.exit_code == 0
    [attempt] = json.loads(by_job.stdout)
    assert json.loads(by_op.stdout) == [attempt]
    assert attempt["operation_key"] == "fulfill-order:5"
    assert attempt["attempt"] == 1
    assert attempt["worker_id"] == "cli-worker-1"
    assert attempt["lock_owner"].startswith("cli-worker-1/")
    assert attempt["fence"] == 1
    assert attempt["outcome"] == Outcome.COMPLETED
    assert attempt["ended_at"] >= attempt["started_at"]
    assert attempt["duration_s"] >= 0
    assert attempt["lease_token"]
    assert "cli-worker-1" in table.stdout
    assert "completed" in table.stdout


@pytest.mark.parametrize("args", [[], ["--job", "1", "--operation", "x"]], ids=["none", "both"])
def test_attempts_needs_exactly_one_of_job_or_operation(shop: Shop, args: list[str]) -> None:
    """Neither or both selectors is a usage error (exit 2)."""
    shop.store.backend  # noqa: B018 - create the store so only the arguments are at fault
    result = run("--url", shop.url, "attempts", *args)

    assert result.exit_code == 2
    assert "exactly one of --job ID or --operation KEY" in one_line_error(result)


@pytest.mark.parametrize(
    ("args", "needle"),
    [(["--job", "42"], "no job with id 42"), (["--operation", "nope:1"], "'nope:1'")],
)
def test_attempts_of_an_unknown_job_or_operation_exit_1(
    shop: Shop, args: list[str], needle: str
) -> None:
    """Not found is a failure (exit 1) with one line naming what was missing."""
    shop.store.backend  # noqa: B018 - an existing, empty store
    result = run("--url", shop.url, "attempts", *args)

    assert result.exit_code == 1
    assert needle in one_line_error(result)


# -- dlq ----------------------------------------------------------------------------------------


def test_dlq_list_and_show_give_reason_payload_and_every_traceback(shop: Shop) -> None:
    """`dlq list` and `dlq show` expose what G8.1 requires: reason, payload, attempt metadata."""
    run("--app", shop.app_path, "enqueue", "charge", "--kwargs", '{"order_id": -4}')
    burst(shop)

    listing = run("--url", shop.url, "dlq", "list", "--json")
    shown = run("--url", shop.url, "dlq", "show", "1")
    shown_json = run("--url", shop.url, "dlq", "show", "1", "--json")
    table = run("--url", shop.url, "dlq", "list")

    assert listing.exit_code == shown.exit_code == shown_json.exit_code == table.exit_code == 0
    assert [job["id"] for job in json.loads(listing.stdout)] == [1]
    assert "fatal error: ValueError" in table.stdout
    assert "reason:        fatal error: ValueError: order id -4 is negative" in shown.stdout
    assert '"order_id": -4' in shown.stdout
    assert "Traceback (most recent call last)" in shown.stdout
    dead = json.loads(shown_json.stdout)
    assert dead["reason"].startswith("fatal error: ValueError")
    assert json.loads(dead["job"]["payload"]) == {"order_id": -4}
    [attempt] = dead["attempts"]
    assert attempt["outcome"] == "dead"
    assert attempt["error_type"] == "ValueError"
    assert "raise ValueError" in attempt["traceback"]


def test_dlq_replay_requeues_the_same_job_with_its_keys(shop: Shop) -> None:
    """`dlq replay` puts the dead job back: same id, arguments and operation key (G8.3)."""
    run("--app", shop.app_path, "enqueue", "fulfill", "--kwargs", '{"order_id": 8}')
    jobs = stores.table(shop.url, "jobs")
    stores.execute(shop.url, [f"UPDATE {jobs} SET status = 'dead', dead_reason = 'test: by hand'"])

    replayed = run("--url", shop.url, "dlq", "replay", "1")
    again = run("--url", shop.url, "dlq", "replay", "1")

    assert replayed.exit_code == 0, replayed.stderr
    assert replayed.stdout.strip() == "job 1 replayed: queued, operation key fulfill-order:8"
    job = shop.store.get_job(1)
    assert (job.status, job.operation_key, json.loads(job.payload)) == (
        JobStatus.QUEUED,
        "fulfill-order:8",
        {"order_id": 8},
    )
    assert again.exit_code == 1
    assert "not in the dead letter queue" in one_line_error(again)
    burst(shop)
    assert shop.fulfilled() == [(8, 1)]
    assert shop.store.get_job(1).status == JobStatus.COMPLETED


def test_dlq_purge_asks_first_and_deletes_the_job_with_its_attempts(shop: Shop) -> None:
    """`dlq purge ID` confirms unless --yes; a refusal keeps everything (G8.3)."""
    for order_id in (-1, -2):
        run(
            *enqueue_args(shop, "charge", json.dumps({"order_id": order_id})),
        )
    burst(shop)

    declined = run("--url", shop.url, "dlq", "purge", "1", input="n\n")
    assert declined.exit_code == 1
    assert len(shop.store.dlq.list()) == 2

    confirmed = run("--url", shop.url, "dlq", "purge", "1", input="y\n")
    assert confirmed.exit_code == 0, confirmed.stderr
    assert "purged 1 dead job" in confirmed.stdout
    assert [job.id for job in shop.store.dlq.list()] == [2]
    assert shop.store.attempts(job_id=1) == []
    assert len(shop.store.attempts(job_id=2)) == 1

    everything = run("--url", shop.url, "dlq", "purge", "--all", "--yes")
    empty = run("--url", shop.url, "dlq", "purge", "--all", "--yes")
    assert everything.exit_code == empty.exit_code == 0
    assert "purged 1 dead job" in everything.stdout
    assert "nothing purged" in empty.stdout
    assert shop.store.jobs() == []


@pytest.mark.parametrize(
    ("args", "code", "needle"),
    [
        (["show", "99"], 1, "no job with id 99"),
        (["show", "1"], 1, "is queued, not in the dead letter queue"),
        (["replay", "99"], 1, "no job with id 99"),
        (["purge", "1", "--yes"], 1, "is queued, not in the dead letter queue"),
        (["purge", "--yes"], 2, "give a job ID, a filter"),
        (["purge", "1", "--all", "--yes"], 2, "a job ID or filters, not both"),
        (["show", "one"], 2, "'one' is not a valid integer"),
    ],
    ids=[
        "show-unknown",
        "show-live",
        "replay-unknown",
        "purge-live",
        "purge-neither",
        "purge-both",
        "show-not-an-id",
    ],
)
def test_dlq_errors_are_one_line_with_their_exit_code(
    shop: Shop, args: list[str], code: int, needle: str
) -> None:
    """Unknown or live job ids exit 1; malformed arguments exit 2; nothing is changed."""
    run("--app", shop.app_path, "enqueue", "charge", "--kwargs", '{"order_id": 1}')

    result = run("--url", shop.url, "dlq", *args)

    assert result.exit_code == code, result.output
    assert needle in one_line_error(result)
    assert shop.store.get_job(1).status == JobStatus.QUEUED


# -- the store ----------------------------------------------------------------------------------


def test_inspecting_a_missing_store_exits_3_and_creates_no_file(tmp_path: Path) -> None:
    """--url to a file that does not exist is "store unavailable" (exit 3), not an empty list."""
    missing = tmp_path / "typo.db"

    result = run("--url", f"sqlite:///{missing}", "jobs")

    assert result.exit_code == 3
    assert "store unavailable" in one_line_error(result)
    assert not missing.exists()


def test_a_file_that_is_not_a_database_exits_3(tmp_path: Path) -> None:
    """A corrupt or foreign file is reported as an unavailable store (exit 3)."""
    garbage = tmp_path / "notes.db"
    garbage.write_bytes(b"these are not the pages of a SQLite database" * 100)

    result = run("--url", f"sqlite:///{garbage}", "dlq", "list")

    assert result.exit_code == 3
    assert "store unavailable" in one_line_error(result)


def test_an_unsupported_store_url_is_a_usage_error(tmp_path: Path) -> None:
    """A URL scheme this version does not support is named in one line (exit 2)."""
    result = run("--url", "mysql://localhost/jobs", "jobs")

    assert result.exit_code == 2
    assert "unsupported store URL scheme 'mysql'" in one_line_error(result)


def test_help_lists_every_command(tmp_path: Path) -> None:
    """`jobguard --help` names every command (listing imports none of them)."""
    result = run("--help")

    assert result.exit_code == 0
    for name in COMMANDS:
        assert f"  {name} " in result.stdout


# -- real processes -----------------------------------------------------------------------------


def test_installed_entry_point_enqueues_and_worker_burst_processes_the_jobs(shop: Shop) -> None:
    """The `jobguard` executable enqueues, `worker --burst` runs every job once and exits 0.

    Real processes only: enqueue, worker and inspection each start their own interpreter
    (G1.2: a job is completed only with its effect committed).
    """
    for order_id in (1, 2, 3):
        enqueued = run_process(
            [
                *enqueue_args(shop, "fulfill", json.dumps({"order_id": order_id})),
                "--dedup-key",
                f"fulfill:{order_id}",
            ],
            shop.directory,
        )
        assert enqueued.returncode == 0, enqueued.stderr
        assert enqueued.stdout.strip() == f"job {order_id} enqueued: fulfill on queue orders"
    duplicate = run_process(
        [
            *enqueue_args(shop, "fulfill", '{"order_id": 1}'),
            "--dedup-key",
            "fulfill:1",
        ],
        shop.directory,
    )
    assert duplicate.stdout.startswith("job 1 deduplicated")

    worker = run_process(
        [
            "--app",
            shop.app_path,
            "worker",
            "--burst",
            "--concurrency",
            "2",
            "--worker-id",
            "burst-1",
        ],
        shop.directory,
    )
    listed = run_process(["--url", shop.url, "jobs", "--json"], shop.directory)

    assert worker.returncode == 0, worker.stderr
    assert "worker burst-1 on queues default, orders" in worker.stderr
    assert "worker stopped: completed=3; released 0" in worker.stderr
    assert listed.returncode == 0, listed.stderr
    assert {job["status"] for job in json.loads(listed.stdout)} == {"completed"}
    assert shop.fulfilled() == [(1, 1), (2, 1), (3, 1)]
    assert {a.worker_id for a in shop.store.attempts()} == {"burst-1"}


def test_installed_entry_point_reports_errors_with_documented_exit_codes(shop: Shop) -> None:
    """A real process exits 2 on bad --kwargs, 1 on an unknown job, 3 on a missing store."""
    bad = run_process(
        ["--app", shop.app_path, "enqueue", "charge", "--kwargs", "{oops"], shop.directory
    )
    shop.store.backend  # noqa: B018 - an existing, empty store for the next command
    unknown = run_process(["--url", shop.url, "dlq", "show", "5"], shop.directory)
    missing = run_process(["--url", "sqlite:///absent.db", "jobs"], shop.directory)

    assert (bad.returncode, unknown.returncode, missing.returncode) == (2, 1, 3)
    assert bad.stderr.startswith("error: Invalid value for '--kwargs': not valid JSON")
    assert unknown.stderr.strip() == "error: no job with id 5"
    assert "Traceback" not in bad.stderr + unknown.stderr + missing.stderr
    assert not (shop.directory / "absent.db").exists()


@contextmanager
def worker_process(shop: Shop, *options: str) -> Iterator[subprocess.Popen[str]]:
    """``jobguard --app … worker OPTIONS`` as a real process; killed and reaped whatever the
    test does, so a failing assertion never leaves a worker behind."""
    proc = subprocess.Popen(
        [*entry_point(), "--app", shop.app_path, "worker", *options],
        cwd=shop.directory,
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_worker_process_finishes_its_running_job_on_sigterm_and_exits_0(shop: Shop) -> None:
    """SIGTERM to `jobguard worker`: no new fetches, the running job finishes in --grace-s,
    the process exits 0 (G2, G9)."""
    go = shop.directory / "go"
    run(
        *enqueue_args(shop, "fulfill", json.dumps({"order_id": 1, "wait_for": str(go)})),
    )
    started = shop.directory / "go.started"
    run(
        *enqueue_args(shop, "fulfill", '{"order_id": 2}'),
        "--delay-s",
        "3600",
    )
    with worker_process(shop, "--grace-s", "20", "--worker-id", "term-1") as proc:
        wait_until(started.exists)
        proc.send_signal(signal.SIGTERM)
        go.touch()  # the handler could not finish before the signal was sent
        _, stderr = proc.communicate(timeout=30)

    assert proc.returncode == 0, stderr
    assert "worker stopped: completed=1; released 0" in stderr
    assert shop.fulfilled() == [(1, 1)]
    assert shop.store.get_job(1).status == JobStatus.COMPLETED
    assert shop.store.get_job(2).status == JobStatus.QUEUED
    assert shop.store.attempts(job_id=2) == []


def test_a_second_sigterm_releases_running_jobs_without_waiting_out_the_grace(
    shop: Shop,
) -> None:
    """A second SIGTERM stops waiting: the running job is released uncharged at once
    (G9; the worker's documented second-signal behaviour)."""
    never = shop.directory / "never-created"
    run(
        *enqueue_args(shop, "fulfill", json.dumps({"order_id": 1, "wait_for": str(never)})),
    )
    started = shop.directory / "never-created.started"
    with worker_process(shop, "--grace-s", "120") as proc:
        wait_until(started.exists)
        # Keep signalling until it exits: the first signal starts the graceful stop, any later
        # one must cut the 120 s grace short (the handler would wait 30 s for its file).
        deadline = time.monotonic() + 20
        while proc.poll() is None and time.monotonic() < deadline:
            proc.send_signal(signal.SIGTERM)
            time.sleep(0.1)
        assert proc.poll() is not None, "the worker kept waiting after a second SIGTERM"
        _, stderr = proc.communicate(timeout=10)

    assert proc.returncode == 0, stderr
    assert "released 1" in stderr
    job = shop.store.get_job(1)
    assert (job.status, job.attempts) == (JobStatus.QUEUED, 0)
    assert [a.outcome for a in shop.store.attempts(job_id=1)] == [Outcome.RELEASED]
    assert shop.fulfilled() == []


def test_worker_stops_gracefully_on_sigterm_as_soon_as_it_announced_itself(shop: Shop) -> None:
    """The "worker ... on queues" line means a SIGTERM is already a graceful stop (exit 0),
    even before the first fetch; scripts and supervisors may signal right after it."""
    for attempt in range(5):  # every round must pass; one alone could miss the short window
        with worker_process(shop) as proc:
            assert proc.stderr is not None
            first = proc.stderr.readline()
            proc.send_signal(signal.SIGTERM)
            _, rest = proc.communicate(timeout=30)
        assert first.startswith("worker "), (attempt, first)
        assert proc.returncode == 0, (attempt, first + rest)
        assert "worker stopped" in rest
