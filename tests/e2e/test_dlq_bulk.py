"""Bulk DLQ replay and purge (#17): filters, the confirmation, two operators at once.

Dead jobs are stored through the backend and buried by SQL (task, queue, dead code and burial
time chosen per job), then acted on through the real ``jobguard`` executable.
"""

from __future__ import annotations

import os
import select
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest

from jobguard import App, DeadFilter, JobStatus, ReplayReport
from jobguard.exceptions import ConfigurationError
from jobguard.models import DeadCode, JobSpec
from tests.support import stores
from tests.support.dead import HOUR, JAN_1, Buried, bury, replayed_in_audit
from tests.support.procs import clean_env, entry_point, wait_until


@pytest.fixture
def dlq_app(store_url: str) -> Iterator[App]:
    """An app on a fresh store of each backend."""
    application = App(store_url)
    yield application
    application.close()


def jobguard(
    url: str, *args: str, cwd: Path, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the real ``jobguard`` executable with ``--url``; no terminal on stdin."""
    return subprocess.run(
        [*entry_point(), "--url", url, *args],
        cwd=cwd,
        env=clean_env(),
        input=stdin if stdin is not None else "",
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


class Operator:
    """A ``jobguard`` process with a pseudo-terminal as stdin and stdout, read as it goes."""

    def __init__(self, url: str, args: Sequence[str], cwd: Path) -> None:
        self.main, side = os.openpty()
        self.proc = subprocess.Popen(
            [*entry_point(), "--url", url, *args],
            cwd=cwd,
            env=clean_env(),
            stdin=side,
            stdout=side,
            stderr=side,
        )
        os.close(side)
        self.seen = b""

    def _read(self, timeout_s: float) -> bool:
        ready, _, _ = select.select([self.main], [], [], timeout_s)
        if not ready:
            return False
        try:
            chunk = os.read(self.main, 65536)
        except OSError:  # the process exited and closed its side
            return False
        self.seen += chunk
        return bool(chunk)

    def wait_for(self, text: str, timeout_s: float = 120.0) -> None:
        """Read until ``text`` was printed (the process is waiting at its question)."""
        deadline = time.monotonic() + timeout_s
        while text.encode() not in self.seen:
            if not self._read(max(0.0, deadline - time.monotonic())):
                raise AssertionError(f"never printed {text!r}: {self.seen.decode()}")

    def answer(self, text: str) -> None:
        """Type ``text`` and Enter."""
        os.write(self.main, text.encode() + b"\n")

    def finish(self) -> tuple[int, str]:
        """Read to the end; the exit code and everything printed."""
        while self._read(120.0):
            pass
        return self.proc.wait(timeout=120), self.seen.decode(errors="replace")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        os.close(self.main)


@contextmanager
def terminals(url: str, n: int, *args: str, cwd: Path) -> Iterator[list[Operator]]:
    """``n`` operators running the same command, each on its own terminal."""
    operators = [Operator(url, args, cwd) for _ in range(n)]
    try:
        yield operators
    finally:
        for operator in operators:
            operator.close()


def with_terminal(url: str, answer: str, *args: str, cwd: Path) -> tuple[int, str]:
    """Run ``jobguard`` on a terminal, answering its question with ``answer``."""
    with terminals(url, 1, *args, cwd=cwd) as [operator]:
        operator.wait_for("?")
        operator.answer(answer)
        return operator.finish()


def dead_ids(app: App) -> set[int]:
    """Ids of every job in the dead letter queue."""
    return {job.id for job in app.dlq.list(10_000)}


def status_of(app: App, ids: Sequence[int]) -> set[JobStatus]:
    """The states the jobs ``ids`` are in."""
    return {app.get_job(job_id).status for job_id in ids}


# -- replay ------------------------------------------------------------------------------------


def test_bulk_replay_of_1000_dead_jobs_through_the_cli_replays_each_once(
    dlq_app: App, store_url: str, tmp_path: Path
) -> None:
    """Acceptance 4: 1,000 dead jobs, one `dlq replay --all --yes`, each queued again once."""
    ids = bury(dlq_app, store_url, [Buried()] * 1000)

    result = jobguard(store_url, "dlq", "replay", "--all", "--yes", cwd=tmp_path)

    assert result.returncode == 0, result.stderr
    assert "replayed 1000 dead jobs" in result.stdout
    assert dead_ids(dlq_app) == set()
    assert status_of(dlq_app, ids) == {JobStatus.QUEUED}
    assert replayed_in_audit(dlq_app) == 1000
    [entry] = dlq_app.audit_trail(10)
    assert entry.target == "all dead jobs"


def test_two_operators_replaying_the_same_selection_at_once_replay_each_job_once(
    dlq_app: App, store_url: str, tmp_path: Path
) -> None:
    """Acceptance 4: two CLI processes both shown the same 1,000 jobs, both answer yes at once.

    Each waits at its question until both have counted the same selection, so both act on it;
    small batches make their transactions take turns.
    """
    ids = bury(dlq_app, store_url, [Buried()] * 1000)
    args = ["dlq", "replay", "--task", "mail", "--batch-size", "25"]
    with terminals(store_url, 2, *args, cwd=tmp_path) as operators:
        for operator in operators:
            operator.wait_for("Replay these 1000 dead jobs?")
        for operator in operators:
            operator.answer("y")
        results = [operator.finish() for operator in operators]

    assert [code for code, _ in results] == [0, 0], results
    assert status_of(dlq_app, ids) == {JobStatus.QUEUED}
    # Each job's replay is counted by exactly one of the two: the totals add up to 1,000.
    assert replayed_in_audit(dlq_app) == 1000
    assert len([e for e in dlq_app.audit_trail(10) if e.action == "replay-dead"]) == 2
    said = sum(int(out.split("replayed ")[-1].split()[0]) for _, out in results)
    assert said == 1000, results
    # Nothing was delivered in between, so no job has an attempt: none ran twice.
    assert dlq_app.attempts(limit=10) == []


def test_filters_select_exactly_what_they_say(dlq_app: App, store_url: str, tmp_path: Path) -> None:
    """--task, --queue, --reason, --since and --until each narrow the selection, together too."""
    jobs = [
        Buried(task="mail", queue="default", code=DeadCode.EXHAUSTED, at=JAN_1),
        Buried(task="mail", queue="bulk", code=DeadCode.FATAL, at=JAN_1 + HOUR),
        Buried(task="bill", queue="default", code=DeadCode.FATAL, at=JAN_1 + 2 * HOUR),
        Buried(task="bill", queue="bulk", code=DeadCode.POISON, at=JAN_1 + 3 * HOUR),
    ]
    ids = bury(dlq_app, store_url, jobs)

    def picks(*args: str) -> set[int]:
        selection = DeadFilter.parse(**dict(zip(args[::2], args[1::2], strict=True)))
        return {job.id for job in dlq_app.dlq.select(selection, 100)}

    assert picks("task", "mail") == {ids[0], ids[1]}
    assert picks("queue", "bulk") == {ids[1], ids[3]}
    assert picks("reason", "fatal") == {ids[1], ids[2]}
    assert picks("since", "2026-01-01T01:00:00Z") == {ids[1], ids[2], ids[3]}
    assert picks("until", "2026-01-01T02:00:00Z") == {ids[0], ids[1]}
    assert picks("since", "2026-01-01T01:00:00", "until", "2026-01-01T03:00:00+00:00") == {
        ids[1],
        ids[2],
    }
    assert picks("task", "bill", "reason", "fatal") == {ids[2]}

    result = jobguard(
        store_url, "dlq", "replay", "--queue", "bulk", "--reason", "fatal", "--yes", cwd=tmp_path
    )

    assert result.returncode == 0, result.stderr
    assert "replayed 1 dead job" in result.stdout
    assert dead_ids(dlq_app) == {ids[0], ids[2], ids[3]}
    [entry] = dlq_app.audit_trail(10)
    assert (entry.action, entry.target) == ("replay-dead", "queue=bulk reason=fatal")


def test_a_job_whose_dedup_key_is_held_is_reported_and_the_rest_replayed(
    dlq_app: App, store_url: str, tmp_path: Path
) -> None:
    """A live job holding a dead job's dedup key keeps that one dead; the others go on."""
    ids = bury(dlq_app, store_url, [Buried(dedup_key="k1"), Buried(dedup_key="k2"), Buried()])
    spec = JobSpec(task="mail", queue="default", payload="{}", max_attempts=3,
                   visibility_timeout_s=30.0, dedup_key="k1")  # fmt: skip
    holder = dlq_app.backend.enqueue(spec)
    preview = dlq_app.dlq.preview(DeadFilter())  # the preview counts the one held back
    assert (preview.count, preview.held, [job.id for job in preview.first]) == (3, 1, ids)
    code, out = with_terminal(store_url, "n", "dlq", "replay", "--all", cwd=tmp_path)
    assert code == 1, out
    assert "1 of them stay dead: a live job holds their dedup key" in out
    assert dead_ids(dlq_app) == set(ids)

    result = jobguard(store_url, "dlq", "replay", "--all", "--yes", cwd=tmp_path)

    assert result.returncode == 0, result.stderr
    assert "replayed 2 dead jobs" in result.stdout
    assert f"job {ids[0]} not replayed: job {holder.id}" in result.stdout
    assert dead_ids(dlq_app) == {ids[0]}
    assert status_of(dlq_app, ids[1:]) == {JobStatus.QUEUED}


def test_the_prompt_shows_the_selection_and_only_yes_acts(
    dlq_app: App, store_url: str, tmp_path: Path
) -> None:
    """On a terminal the count and first rows are shown; "n" changes nothing, "y" acts."""
    ids = bury(dlq_app, store_url, [Buried(task="mail")] * 3 + [Buried(task="bill")])

    code, out = with_terminal(store_url, "n", "dlq", "replay", "--task", "mail", cwd=tmp_path)
    assert code == 1, out
    assert "3 dead jobs match task=mail" in out
    assert "Replay these 3 dead jobs?" in out
    assert dead_ids(dlq_app) == set(ids)
    assert dlq_app.audit_trail(10) == []

    code, out = with_terminal(store_url, "y", "dlq", "replay", "--task", "mail", cwd=tmp_path)
    assert code == 0, out
    assert "replayed 3 dead jobs" in out
    assert dead_ids(dlq_app) == {ids[3]}

    code, out = with_terminal(store_url, "n", "dlq", "purge", "--task", "bill", cwd=tmp_path)
    assert code == 1, out
    assert dead_ids(dlq_app) == {ids[3]}
    code, out = with_terminal(store_url, "y", "dlq", "purge", "--task", "bill", cwd=tmp_path)
    assert code == 0, out
    assert "purged 1 dead job" in out
    assert dead_ids(dlq_app) == set()


@pytest.mark.parametrize("verb", ["replay", "purge"])
def test_the_answer_acts_on_what_was_shown_not_on_jobs_buried_while_asking(
    dlq_app: App, store_url: str, tmp_path: Path, verb: str
) -> None:
    """A job that dies while the operator reads the question is not touched by the "y"."""
    shown = bury(dlq_app, store_url, [Buried(task="mail")] * 2)
    with terminals(store_url, 1, "dlq", verb, "--task", "mail", cwd=tmp_path) as [operator]:
        operator.wait_for("?")
        later = bury(dlq_app, store_url, [Buried(task="mail", at=dlq_app.backend.now())])
        operator.answer("y")
        code, out = operator.finish()
    assert code == 0, out
    assert "2 dead jobs match task=mail (buried before " in out
    assert f"{verb.removesuffix('e')}ed 2 dead jobs" in out
    assert dead_ids(dlq_app) == set(later)
    if verb == "replay":
        assert status_of(dlq_app, shown) == {JobStatus.QUEUED}
    [entry] = dlq_app.audit_trail(10)
    assert "as previewed at" in entry.detail


def test_without_a_terminal_and_without_yes_nothing_is_done_and_exit_is_2(
    dlq_app: App, store_url: str, tmp_path: Path
) -> None:
    """A script that forgot --yes is refused, not left hanging on a question."""
    ids = bury(dlq_app, store_url, [Buried()] * 2)

    for verb in ("replay", "purge"):
        result = jobguard(store_url, "dlq", verb, "--all", cwd=tmp_path, stdin="y\n")
        assert result.returncode == 2, result
        assert "--yes" in result.stderr
    assert dead_ids(dlq_app) == set(ids)
    assert dlq_app.audit_trail(10) == []


# -- purge -------------------------------------------------------------------------------------


def test_purge_with_filters_deletes_only_the_selection_with_its_attempts(
    dlq_app: App, store_url: str, tmp_path: Path
) -> None:
    """`dlq purge --until T --queue Q --yes` deletes exactly those dead jobs, audited."""
    jobs = [
        Buried(queue="bulk", at=JAN_1),
        Buried(queue="bulk", at=JAN_1 + 2 * HOUR),
        Buried(queue="default", at=JAN_1),
    ]
    ids = bury(dlq_app, store_url, jobs)

    result = jobguard(
        store_url,
        "dlq",
        "purge",
        "--queue",
        "bulk",
        "--until",
        "2026-01-01T01:00:00Z",
        "--yes",
        "--batch-size",
        "1",
        cwd=tmp_path,
    )

    assert result.returncode == 0, result.stderr
    assert "purged 1 dead job" in result.stdout
    assert dead_ids(dlq_app) == {ids[1], ids[2]}
    [entry] = dlq_app.audit_trail(10)
    assert entry.action == "purge-dead"
    assert entry.target == "queue=bulk until=2026-01-01T01:00:00Z"
    assert entry.detail.startswith("1 purged")


def test_app_api_replays_and_purges_by_filter_with_an_audit_entry(
    dlq_app: App, store_url: str
) -> None:
    """`app.replay_dead` and `app.purge_dead` take a DeadFilter and report what they did."""
    ids = bury(dlq_app, store_url, [Buried(task="mail"), Buried(task="bill")])

    report = dlq_app.replay_dead(DeadFilter(task="mail"), actor="ops")
    purged = dlq_app.purge_dead(DeadFilter(task="bill"), actor="ops")

    assert (report.replayed, report.held, report.gone) == ([ids[0]], [], 0)
    assert purged == 1
    assert [(e.actor, e.action) for e in dlq_app.audit_trail(10)] == [
        ("ops", "purge-dead"),
        ("ops", "replay-dead"),
    ]


# -- bad input ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--reason", "tired"], "--reason 'tired' is not a dead code"),
        (["--since", "yesterday"], "--since 'yesterday' is not a time"),
        (["--until", "2026-13-01"], "--until '2026-13-01' is not a time"),
        ([], "give a job ID, a filter"),
        (["--all", "--task", "mail"], "--all selects every dead job"),
        (["1", "--task", "mail"], "a job ID or filters, not both"),
        (["--task", ""], "--task must not be empty"),
        (["--since", "2026-01-02", "--until", "2026-01-01"], "--since is after --until"),
    ],
    ids=["code", "since", "until", "empty", "all-and-filter", "id-and-filter", "blank", "order"],
)
@pytest.mark.parametrize("verb", ["replay", "purge"])
def test_bad_filters_are_a_clear_usage_error_and_change_nothing(
    dlq_app: App, store_url: str, tmp_path: Path, verb: str, args: list[str], needle: str
) -> None:
    """Each malformed selection exits 2 with one line naming what is wrong."""
    ids = bury(dlq_app, store_url, [Buried()])

    result = jobguard(store_url, "dlq", verb, *args, "--yes", cwd=tmp_path)

    assert result.returncode == 2, result
    assert needle in result.stderr
    assert "Traceback" not in result.stderr
    assert dead_ids(dlq_app) == set(ids)
    assert dlq_app.audit_trail(10) == []


def test_a_bad_filter_value_in_the_api_is_a_configuration_error() -> None:
    """DeadFilter.parse validates where the value enters."""
    with pytest.raises(ConfigurationError, match="not a dead code"):
        DeadFilter.parse(reason="tired")
    with pytest.raises(ConfigurationError, match="not a time"):
        DeadFilter.parse(since="noon")


# -- the race, made deterministic ----------------------------------------------------------------


@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
def test_a_job_the_other_operator_moved_first_is_skipped_not_replayed_twice(
    dlq_app: App, store_url: str
) -> None:
    """The other operator's transaction moves job 2 while this replay has already selected it.

    This replay's UPDATE waits for that row, then finds it no longer dead: it is counted as
    gone, and jobs 1 and 3 are replayed. (SQLite serialises writers, so the race cannot arise.)
    """
    ids = bury(dlq_app, store_url, [Buried()] * 3)
    table = stores.table(store_url, "jobs")
    other = stores.connect(store_url)
    reports: list[ReplayReport] = []
    try:
        other.autocommit = False
        other.execute(f"UPDATE {table} SET status = 'queued' WHERE id = %s", (ids[1],))
        replaying = threading.Thread(
            target=lambda: reports.append(dlq_app.replay_dead(DeadFilter()))
        )
        replaying.start()
        wait_until(lambda: waiting_on_a_row_lock(store_url))
        other.commit()
        replaying.join(timeout=60)
    finally:
        other.close()

    [report] = reports
    assert (report.replayed, report.held, report.gone) == ([ids[0], ids[2]], [], 1)
    [entry] = dlq_app.audit_trail(10)
    assert entry.detail == "2 replayed, 0 held, 1 already gone"


def waiting_on_a_row_lock(url: str) -> bool:
    """Whether a replay's UPDATE in this database waits for a row another transaction holds."""
    found = stores.query(
        url,
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND wait_event_type = 'Lock' AND position(? IN query) > 0",
        ["SET status = 'queued', available_at"],
    )
    return bool(found[0][0])


def test_two_dead_jobs_with_one_dedup_key_replay_the_first_and_report_the_second(
    dlq_app: App, store_url: str
) -> None:
    """Within one batch: the first replayed job then holds the key, the second is held back."""
    ids = bury(dlq_app, store_url, [Buried()] * 3)
    table = stores.table(store_url, "jobs")  # one key on two dead jobs: set by hand
    stores.execute(store_url, [f"UPDATE {table} SET dedup_key = 'k' WHERE id IN (?, ?)"], [ids[:2]])

    report = dlq_app.replay_dead(DeadFilter(), actor="ops", batch_size=2)

    assert (report.replayed, report.held, report.gone) == ([ids[0], ids[2]], [(ids[1], ids[0])], 0)
    assert dead_ids(dlq_app) == {ids[1]}
