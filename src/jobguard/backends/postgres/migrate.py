"""``jobguard migrate`` for a PostgreSQL URL: connect, migrate jobguard's schema, disconnect."""

from __future__ import annotations

import psycopg

from jobguard.backends.postgres.schema import migrate
from jobguard.backends.postgres.url import parse_postgres_url
from jobguard.exceptions import StoreUnavailableError


def migrate_url(url: str, *, dry_run: bool = False) -> tuple[int, list[str]]:
    """Migrate the schema a ``postgresql://`` URL names; see :func:`.schema.migrate`."""
    parsed = parse_postgres_url(url)
    try:
        conn = psycopg.connect(parsed.conninfo, autocommit=True, connect_timeout=10)
    except psycopg.Error as exc:
        raise StoreUnavailableError(
            f"cannot connect to PostgreSQL at {parsed.display}: {parsed.redact(str(exc).strip())}"
        ) from exc
    with conn:
        return migrate(conn, parsed.schema, dry_run=dry_run)
