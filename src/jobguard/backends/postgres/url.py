"""PostgreSQL store URLs: validated where they are written, without importing the driver."""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

from jobguard.exceptions import ConfigurationError

DEFAULT_SCHEMA = "jobguard"
MASK = "***"
# PostgreSQL names end at 63 bytes, and the schema's notification channel is ``SCHEMA_jobs``:
# a longer schema would migrate, then fail every enqueue.
CHANNEL_SUFFIX = "_jobs"
MAX_SCHEMA_LENGTH = 63 - len(CHANNEL_SUFFIX)
# An unquoted PostgreSQL identifier, lower case, that leaves room for its channel's name.
IDENTIFIER = re.compile(rf"[a-z_][a-z0-9_]{{0,{MAX_SCHEMA_LENGTH - 1}}}")


@dataclass(frozen=True, slots=True)
class PostgresURL:
    """A parsed store URL: what psycopg connects with, jobguard's schema, and a safe display."""

    conninfo: str
    schema: str
    display: str
    password: str | None = None

    def redact(self, text: str) -> str:
        """``text`` (a driver's error message, say) with the password masked wherever it is."""
        return text.replace(self.password, MASK) if self.password else text


def check_schema_name(schema: str) -> str:
    """The schema name must be a plain lower-case identifier (it is quoted, never formatted)."""
    if not isinstance(schema, str) or not IDENTIFIER.fullmatch(schema):
        raise ConfigurationError(
            f"schema name {schema!r} is not a plain identifier (a lower-case letter or '_', "
            f"then letters, digits or '_'; {MAX_SCHEMA_LENGTH} characters at most, so that its "
            f"notification channel, SCHEMA{CHANNEL_SUFFIX}, fits PostgreSQL's 63)"
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
    password = parts.password
    if password is not None:
        netloc = netloc.replace(f":{password}@", f":{MASK}@", 1)
    shown = []
    for key, value in query:
        if key == "password":  # libpq takes it in the query too: masked the same
            password = value
        shown.append((key, MASK if key == "password" else value))
    display = urlunsplit(parts._replace(netloc=netloc, query=urlencode(shown, safe="*")))
    return PostgresURL(
        conninfo,
        check_schema_name(DEFAULT_SCHEMA if chosen is None else chosen),
        display,
        password or None,
    )


def display_url(url: str) -> str:
    """A PostgreSQL URL as it may be shown: its password masked (``***``)."""
    return parse_postgres_url(url).display
