"""jobguard's named statements in PostgreSQL's own form, converted once.

psycopg reads a statement's text at each execution to turn its ``%(name)s`` placeholders into
PostgreSQL's ``$n``; it caches that only for texts up to 4,096 bytes, and the fetch's and the
settle's are longer (60 and 43 us of CPU each time on a 2-core VM, against 4 and 6 us for the
form below: ``python -m bench.statement_cpu``). A :class:`Statement` holds the converted text,
sent as it is through psycopg's ``RawCursor`` with the values in order, so nothing is read
again at an execution.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.adapt import PyFormat

from jobguard.backends.postgres.placeholders import Converted, convert


@dataclass(frozen=True)
class Statement:
    """A named statement: its psycopg ``text`` (for a connection that is not psycopg's own, an
    asyncio caller's, bridged) and ``converted``, the same in PostgreSQL's form (``$n``
    placeholders, one for each name; a name used twice takes the same number, as psycopg
    does)."""

    text: str
    converted: Converted

    @classmethod
    def of(cls, text: str) -> Statement:
        """``text`` (psycopg's named placeholders only) with its native form."""
        try:
            converted = convert(text.encode(), "utf-8")
        except psycopg.ProgrammingError as exc:
            raise ValueError(f"only %(name)s placeholders are converted: {exc}") from None
        if converted.count and (
            converted.names is None or set(converted.formats) != {PyFormat.AUTO}
        ):
            raise ValueError(f"only %(name)s placeholders are converted: {text[:80]!r}")
        return cls(text, converted)

    @property
    def native(self) -> bytes:
        """The text with ``$n`` placeholders."""
        return self.converted.native

    @property
    def names(self) -> tuple[str, ...]:
        """The name each ``$n`` stands for, in order."""
        return self.converted.names or ()

    def values(self, params: Mapping[str, Any]) -> Sequence[Any]:
        """``params`` in the order of the native placeholders (psycopg's error for one
        missing)."""
        return self.converted.values(params)


def native_statements(texts: Mapping[str, str]) -> dict[str, Statement]:
    """Each named statement of ``texts`` with its native form."""
    return {name: Statement.of(text) for name, text in texts.items()}
