"""Storage backends and the URL that picks one."""

from __future__ import annotations

from urllib.parse import urlsplit

from jobguard.backends.base import Backend
from jobguard.exceptions import ConfigurationError

DEFAULT_URL = "sqlite:///jobguard.db"
POSTGRES_SCHEMES = ("postgresql", "postgres")


def sqlite_path(url: str) -> str:
    """The file path of a ``sqlite:///path`` URL (relative) or ``sqlite:////abs/path``."""
    prefix = "sqlite:///"
    if not url.startswith(prefix) or len(url) == len(prefix):
        raise ConfigurationError(
            f"SQLite URL must look like sqlite:///path/to/file.db, got {url!r}"
        )
    path = url[len(prefix) :]
    if path == ":memory:" or path.startswith("file::memory:"):
        raise ConfigurationError(
            "an in-memory SQLite database lives in one connection only; jobguard's workers, "
            "threads and producers share the store, so give it a file: sqlite:///jobs.db"
        )
    return path


def check_store_url(url: str) -> str:
    """Validate a store URL without opening it; return it unchanged.

    Refused here, where the URL is written, rather than at first use: an empty URL, an
    in-memory SQLite database, and any scheme jobguard has no backend for.
    """
    if not isinstance(url, str) or not url.strip():
        raise ConfigurationError(
            f"the store URL is empty; give one such as {DEFAULT_URL} or "
            "postgresql://user@host/dbname (or leave it out for the default)"
        )
    scheme = urlsplit(url).scheme
    if scheme == "sqlite":
        sqlite_path(url)
    elif scheme in POSTGRES_SCHEMES:
        from jobguard.backends.postgres.url import parse_postgres_url

        parse_postgres_url(url)
    else:
        raise ConfigurationError(
            f"unsupported store URL scheme {scheme!r}; jobguard stores jobs in SQLite "
            "(sqlite:///path/to/file.db) or PostgreSQL (postgresql://user@host/dbname)"
        )
    return url


def display_url(url: str) -> str:
    """A checked store URL as it may be shown: a PostgreSQL password masked (``***``), whether
    it was given before the ``@`` or as ``?password=``."""
    if urlsplit(url).scheme in POSTGRES_SCHEMES:
        from jobguard.backends.postgres.url import display_url as postgres_display

        return postgres_display(url)
    return url


def open_backend(url: str | None = None) -> Backend:
    """Open the backend a URL names: ``sqlite:///path`` (the default) or ``postgresql://…``."""
    url = check_store_url(DEFAULT_URL if url is None else url)
    if urlsplit(url).scheme == "sqlite":
        from jobguard.backends.sqlite import SQLiteBackend

        return SQLiteBackend(sqlite_path(url))
    from jobguard.backends.postgres import PostgresBackend

    return PostgresBackend(url)


def migrate_store(url: str | None = None, *, dry_run: bool = False) -> tuple[int, list[str]]:
    """Bring the store at ``url`` to the schema this jobguard knows; return (version, SQL run).

    With ``dry_run`` nothing changes and the SQL that would run is returned. Needed before a
    PostgreSQL store is first used (``jobguard migrate``); SQLite files migrate when opened.
    """
    url = check_store_url(DEFAULT_URL if url is None else url)
    if urlsplit(url).scheme == "sqlite":
        from jobguard.backends.sqlite.connection import (
            SQLiteOptions,
            migrate,
            open_connection,
            planned_migrations,
        )

        if dry_run:  # creates no file and changes none (not even its journal mode)
            return planned_migrations(sqlite_path(url))
        conn = open_connection(SQLiteOptions(sqlite_path(url)))
        try:
            return migrate(conn, dry_run=dry_run)
        finally:
            conn.close()
    from jobguard.backends.postgres.migrate import migrate_url

    return migrate_url(url, dry_run=dry_run)
