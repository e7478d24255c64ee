"""PostgreSQL store URLs: validated where they are written, without importing the driver."""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

from jobguard.exceptions import ConfigurationError

DEFAULT_SCHEMA = "jobguard"
# An unquoted PostgreSQL identifier, lower case, within NAMEDATALEN (63 bytes).
IDENTIFIER = re.compile(r"[a-z_][a-z0-9_]{0,62}")


@dataclass(frozen=True, slots=True)
class PostgresURL:
    """A parsed store URL: what psycopg connects with, jobguard's schema, and a safe display."""

    conninfo: str
    schema: str
    display: str


def check_schema_name(schema: str) -> str:
    """The schema name must be a plain lower-case identifier (it is quoted, never formatted)."""
    if not isinstance(schema, str) or not IDENTIFIER.fullmatch(schema):
        raise ConfigurationError(
            f"schema name {schema!r} is not a plain identifier (a lower-case letter or '_', "
            "then letters, digits or '_'; 63 characters at most)"
        )
    return schema


def parse_postgres_url(url: str, schema: str | None = None) -> PostgresURL:
    """Split jobguard's own ``schema`` option off a ``postgresql://`` URL and check both.

    ``schema`` wins over a ``?schema=`` in the URL; the default is ``jobguard``.
    """
    parts = urlsplit(url)
    if parts.scheme not in ("postgresql", "postgres"):
        raise ConfigurationError(f"not a PostgreSQL URL: {parts.scheme!r}")
    try:
        query = parse_qsl(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
        _ = parts.port  # a port that is not a number raises here
    except ValueError as exc:
        raise ConfigurationError(f"PostgreSQL URL is malformed: {exc}") from exc
    chosen = schema
    options = []
    for key, value in query:
        if key == "schema":
            chosen = value if chosen is None else chosen
        else:
            options.append((key, value))
    # libpq reads %20 as a space but not "+": quote, never quote_plus
    conninfo = urlunsplit(parts._replace(query=urlencode(options, quote_via=quote)))
    netloc = parts.netloc
    if parts.password is not None:
        netloc = netloc.replace(f":{parts.password}@", ":***@", 1)
    display = urlunsplit(parts._replace(netloc=netloc))
    return PostgresURL(
        conninfo, check_schema_name(DEFAULT_SCHEMA if chosen is None else chosen), display
    )
