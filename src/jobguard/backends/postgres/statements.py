"""jobguard's named statements in PostgreSQL's own form, converted once.

psycopg reads a statement's text at each execution to turn its ``%(name)s`` placeholders into
PostgreSQL's ``$n``; it caches that only for texts up to 4,096 bytes, and the fetch's and the
settle's are longer (60 and 43 us of CPU each time on a 2-core VM, against 4 and 6 us for the
form below: ``python -m bench.statement_cpu``). A :class:`Statement` holds the converted text,
sent as it is through psycopg's ``RawCursor`` with the values in order, so nothing is read
again at an execution.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import psycopg

# What psycopg reads in a statement: a named placeholder, %% for a literal %, or (refused
# here) any other use of %.
_PLACEHOLDER = re.compile(r"%\((\w+)\)s|(%%)|%")


@dataclass(frozen=True)
class Statement:
    """A named statement: its psycopg ``text`` (for a connection that is not psycopg's own, an
    asyncio caller's, bridged) and ``native``, the same with ``$n`` placeholders, one for each
    of ``names`` (a name used twice takes the same number, as psycopg does)."""

    text: str
    native: bytes
    names: tuple[str, ...]

    @classmethod
    def of(cls, text: str) -> Statement:
        """``text`` (psycopg's named placeholders only) with its native form."""
        names: list[str] = []

        def native(match: re.Match[str]) -> str:
            name, percent = match.groups()
            if percent:
                return "%"
            if name is None:
                raise ValueError(f"only %(name)s placeholders are converted: {text[:80]!r}")
            if name not in names:
                names.append(name)
            return f"${names.index(name) + 1}"

        return cls(text, _PLACEHOLDER.sub(native, text).encode(), tuple(names))

    def values(self, params: Mapping[str, Any]) -> list[Any]:
        """``params`` in the order of the native placeholders."""
        try:
            return [params[name] for name in self.names]
        except KeyError as exc:
            # psycopg's own error for a missing parameter, so callers handle it alike.
            raise psycopg.ProgrammingError(f"query parameter missing: {exc.args[0]}") from None


def native_statements(texts: Mapping[str, str]) -> dict[str, Statement]:
    """Each named statement of ``texts`` with its native form."""
    return {name: Statement.of(text) for name, text in texts.items()}
