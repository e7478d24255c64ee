"""A caller's statement turned into PostgreSQL's own form, by psycopg's rules, once per text.

``ctx.db_writes`` takes SQL with psycopg's placeholders (``%s``, ``%b``, ``%t`` or the same
named, ``%(name)s``) and sends it through :mod:`jobguard.backends.postgres.onetrip`, below
psycopg's cursors; this module reads a text the way psycopg's cursor reads it (the same
placeholders, the same ``%%``, the same errors with the same messages), so that a statement
runs alike whichever way it is sent. A property test holds it to psycopg's own reading.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import psycopg
from psycopg.adapt import PyFormat

# psycopg's pattern: a % and the character after it, or a name in parentheses and the
# character after that (a newline is no character here, as in psycopg's).
_PLACEHOLDER = re.compile(rb"%(?:\(([^)]+)\).|.)")
_FORMATS = {b"s": PyFormat.AUTO, b"t": PyFormat.TEXT, b"b": PyFormat.BINARY}
# Texts longer than this are read again at each use, as psycopg does (generated statements
# of many rows would crowd out the ones that repeat).
_CACHED_LENGTH = 4096


@dataclass(frozen=True)
class Converted:
    """A text with ``$n`` placeholders, the format of each, (named placeholders) the name each
    number stands for (``names`` is ``None`` for positional ones), and how many placeholders
    the text has (a name used twice counts twice, as psycopg counts)."""

    native: bytes
    formats: tuple[PyFormat, ...]
    names: tuple[str, ...] | None
    count: int

    def values(self, params: Any) -> Sequence[Any]:
        """``params`` in placeholder order, checked against the text as psycopg checks them."""
        if _is_sequence(params):
            if len(params) != self.count:
                raise psycopg.ProgrammingError(
                    f"the query has {self.count} placeholders but {len(params)} parameters "
                    "were passed"
                )
            if params and self.names is not None:
                raise TypeError("named placeholders require a mapping of parameters")
            sequence: Sequence[Any] = params  # sent as it is, as psycopg sends it
            return sequence
        if params and self.formats and self.names is None:
            raise TypeError("positional placeholders (%s) require a sequence of parameters")
        try:
            return [params[name] for name in self.names or ()]
        except KeyError:
            missing = sorted({name for name in self.names or () if name not in params})
            raise psycopg.ProgrammingError(
                f"query parameter missing: {', '.join(missing)}"
            ) from None


def _is_sequence(params: Any) -> bool:
    if isinstance(params, list | tuple):
        return True
    if isinstance(params, dict):
        return False
    if isinstance(params, Sequence) and not isinstance(params, bytes | str):
        return True
    if isinstance(params, Mapping):
        return False
    raise TypeError(
        f"query parameters should be a sequence or a mapping, got {type(params).__qualname__}"
    )


def convert(query: bytes, encoding: str) -> Converted:
    """``query`` in PostgreSQL's form; raises psycopg's ``ProgrammingError`` as psycopg would."""
    if len(query) <= _CACHED_LENGTH:
        return _cached(query, encoding)
    return _convert(query, encoding)


@lru_cache(maxsize=256)
def _cached(query: bytes, encoding: str) -> Converted:
    return _convert(query, encoding)


def _convert(query: bytes, encoding: str) -> Converted:
    pieces: list[bytes] = []
    formats: list[PyFormat] = []
    order: list[str] = []
    named_formats: dict[str, PyFormat] = {}
    named: bool | None = None
    conflict: str | None = None
    count = 0
    start = 0
    for match in _PLACEHOLDER.finditer(query):
        pieces.append(query[start : match.start()])
        start = match.end()
        found = match.group(0)
        if found == b"%%":
            pieces.append(b"%")
            continue
        if found == b"%(":
            word = query[match.start() :].split()[0].decode(encoding)
            raise psycopg.ProgrammingError(f"incomplete placeholder: '{word}'")
        if found == b"% ":
            raise psycopg.ProgrammingError(
                "incomplete placeholder: '%'; if you want to use '%' as an operator you can "
                "double it up, i.e. use '%%'"
            )
        if found[-1:] not in _FORMATS:
            raise psycopg.ProgrammingError(
                f"only '%s', '%b', '%t' are allowed as placeholders, got '{found.decode(encoding)}'"
            )
        name = match.group(1)
        if named is None:
            named = name is not None
        elif named != (name is not None):
            raise psycopg.ProgrammingError("positional and named placeholders cannot be mixed")
        count += 1
        wanted = _FORMATS[found[-1:]]
        if name is None:
            formats.append(wanted)
            pieces.append(b"$%d" % len(formats))
            continue
        # A name used twice takes the number of its first use, in the same format.
        key = name.decode(encoding)
        if key not in named_formats:
            named_formats[key] = wanted
            order.append(key)
            formats.append(wanted)
        elif named_formats[key] != wanted and conflict is None:
            conflict = key
        pieces.append(b"$%d" % (order.index(key) + 1))
    if conflict is not None:  # psycopg reads the whole text before it says so
        raise psycopg.ProgrammingError(f"placeholder '{conflict}' cannot have different formats")
    pieces.append(query[start:])
    names = tuple(order) if named else None
    return Converted(b"".join(pieces), tuple(formats), names, count)
