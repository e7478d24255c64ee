"""Bad input is refused where it enters, with the reason, never reported as an outage (#18).

PostgreSQL text cannot hold a NUL byte; SQLite can. So a NUL in a key or a lookup argument
used to reach PostgreSQL and come back as ``StoreUnavailableError`` (the CLI's exit 3, "the
store is down"), while SQLite stored it. Both backends now refuse it before the store, alike;
so are a schema name too long for its notification channel and a ``connection=`` that is
closed or has no jobguard schema.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from jobguard import App, ConfigurationError, Context, EnqueueError, JobStatus
from jobguard.backends.postgres.url import MAX_SCHEMA_LENGTH, check_schema_name
from tests.e2e.test_cli import run_process
from tests.support import pg, stores

NUL = "a\x00b"
NUL_KWARGS = '{"order": "a\\u0000b"}'


@pytest.fixture
def shop(store_app: App) -> App:
    @store_app.task(name="ship", operation_key="ship:{order}", resource_key="order:{order}")
    def ship(ctx: Context, order: str) -> None:
        """Nothing to do: the tests are about what reaches the store."""

    _ = store_app.backend
    return store_app


ENQUEUES: dict[str, Callable[[App], Any]] = {
    "dedup_key": lambda app: app.tasks["ship"].options(dedup_key=NUL).enqueue(order="1"),
    "operation_key": lambda app: app.tasks["ship"].options(operation_key=NUL).enqueue(order="1"),
    "resource_key": lambda app: app.tasks["ship"].options(resource_key=NUL).enqueue(order="1"),
    "rendered key": lambda app: app.tasks["ship"].enqueue(order=NUL),
    "app.enqueue": lambda app: app.enqueue("ship", {"order": "1"}, dedup_key=NUL),
}


@pytest.mark.parametrize("where", list(ENQUEUES))
def test_a_nul_byte_in_a_key_is_refused_at_enqueue_on_every_backend(shop: App, where: str) -> None:
    with pytest.raises(EnqueueError, match="NUL") as raised:
        ENQUEUES[where](shop)
    assert "StoreUnavailable" not in type(raised.value).__name__
    assert shop.counts()[JobStatus.QUEUED] == 0


LOOKUPS: dict[str, Callable[[App], Any]] = {
    "operation()": lambda app: app.operation(NUL),
    "attempts(operation_key=)": lambda app: app.attempts(operation_key=NUL),
    "find_jobs(task=)": lambda app: app.find_jobs(task=NUL),
    "find_jobs(queue=)": lambda app: app.find_jobs(queue=NUL),
    "lock()": lambda app: app.lock(NUL).__enter__(),
    "dlq.replay(actor=)": lambda app: app.dlq.replay(1, actor=NUL),
    "dlq.purge(actor=)": lambda app: app.dlq.purge(actor=NUL),
    "diagnose(task=)": lambda app: app.diagnose(task=NUL),
}


@pytest.mark.parametrize("where", list(LOOKUPS))
def test_a_nul_byte_in_a_lookup_argument_is_a_configuration_error(shop: App, where: str) -> None:
    with pytest.raises(ConfigurationError, match="NUL"):
        LOOKUPS[where](shop)


def test_the_cli_exits_2_not_3_for_a_nul_in_an_operation_key(
    store_url: str, tmp_path: Path
) -> None:
    """``jobguard attempts --operation $'a\\x00b'`` cannot be typed (argv ends at NUL), but
    ``--kwargs`` can carry one: the enqueue exits 2 naming it, on both backends."""
    module = tmp_path / "nul_app.py"
    module.write_text(
        "from jobguard import App\n"
        f"app = App({store_url!r})\n"
        "@app.task(name='ship', operation_key='ship:{order}')\n"
        "def ship(ctx, order):\n"
        "    pass\n"
    )
    done = run_process(
        ["--app", "nul_app:app", "enqueue", "ship", "--kwargs", NUL_KWARGS], tmp_path
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "NUL" in lines[0]


@pytest.mark.parametrize("worker_id", ["w\x00x", "", "   ", 5])
def test_a_worker_id_with_a_nul_byte_is_refused_when_the_worker_is_made(
    shop: App, worker_id: Any
) -> None:
    with pytest.raises(ConfigurationError, match="worker_id"):
        shop.worker(worker_id=worker_id, install_signal_handlers=False)


def test_a_schema_name_must_leave_room_for_its_channel_name() -> None:
    """The notification channel is ``SCHEMA_jobs`` and PostgreSQL names end at 63 bytes."""
    longest = "s" * MAX_SCHEMA_LENGTH
    assert check_schema_name(longest) == longest
    assert len(f"{longest}_jobs") == 63
    for length in (MAX_SCHEMA_LENGTH + 1, 63):
        with pytest.raises(ConfigurationError, match=f"{MAX_SCHEMA_LENGTH} characters at most"):
            check_schema_name("s" * length)


def test_a_long_schema_name_is_refused_before_anything_is_created(tmp_path: Path) -> None:
    database = pg.session_database()
    schema = "s" + "x" * 60
    url = f"{database}?schema={schema}"
    with pytest.raises(ConfigurationError, match="characters at most"):
        App(url)
    done = run_process(["--url", url, "migrate"], tmp_path)
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    rows = stores.query(
        database + "?schema=public",
        "SELECT count(*) FROM information_schema.schemata WHERE schema_name = ?",
        [schema],
    )
    assert rows == [(0,)]


def closed_connection(url: str) -> Any:
    conn: Any
    if stores.kind_of(url) == "sqlite":
        conn = sqlite3.connect(stores.sqlite_file(url))
    else:
        conn = psycopg.connect(stores.conninfo_of(url))
    conn.close()
    return conn


def test_a_closed_connection_is_refused_with_the_reason(shop: App, store_url: str) -> None:
    with pytest.raises(ConfigurationError, match="connection= is closed"):
        shop.tasks["ship"].enqueue(order="1", connection=closed_connection(store_url))
    assert shop.jobs() == []


def test_a_connection_without_jobguards_schema_is_refused_with_the_reason(
    shop: App, store_url: str, tmp_path: Path
) -> None:
    """On SQLite another file; on PostgreSQL another database of the same server: neither holds
    the store's tables, so the job would be written nowhere a worker looks."""
    conn: Any
    if stores.kind_of(store_url) == "sqlite":
        conn = sqlite3.connect(tmp_path / "other.db")
        expected = "not on the store's file"
    else:
        conn = psycopg.connect(pg.ADMIN_URL)
        expected = "has no jobguard schema"
    try:
        with pytest.raises(ConfigurationError, match=expected):
            shop.tasks["ship"].enqueue(order="1", connection=conn)
        if stores.kind_of(store_url) != "sqlite":
            # Refused before anything was sent in the caller's transaction: it is still usable.
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        conn.close()
    assert shop.jobs() == []
