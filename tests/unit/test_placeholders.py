"""A db_writes statement's placeholders read as psycopg's cursor reads them.

:mod:`jobguard.backends.postgres.placeholders` converts a caller's text below psycopg's cursors;
these tests hold it to psycopg's own reading of the same text and parameters (its query
converter, read here as the oracle): the same text sent, the same values, types and formats,
or the same error with the same message.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from psycopg._queries import PostgresQuery
from psycopg.adapt import PyFormat, Transformer

from jobguard.backends.postgres.placeholders import convert

PIECES = [
    "INSERT INTO t VALUES (",
    ", ",
    ")",
    " x LIKE 'a",
    "'",
    "\n",
    "%s",
    "%b",
    "%t",
    "%(a)s",
    "%(b)s",
    "%(a)t",
    "%(a)b",
    "%(c)s",
    "%%",
    "% ",
    "%x",
    "%(",
    "%(a",
    "%",
    "é",
]


def psycopgs_reading(query: bytes, params: Any) -> tuple[Any, ...]:
    converter = PostgresQuery(Transformer())
    try:
        converter.convert(query, params)
    except (psycopg.Error, TypeError, ValueError) as exc:
        return type(exc), str(exc)
    formats = None if converter.formats is None else list(converter.formats)
    return converter.query, converter.params, converter.types, formats


def our_reading(query: bytes, params: Any) -> tuple[Any, ...]:
    transformer = Transformer()
    try:
        converted = convert(query, "utf-8")
        values = converted.values(params)
        dumped = transformer.dump_sequence(values, converted.formats)
    except (psycopg.Error, TypeError, ValueError) as exc:
        return type(exc), str(exc)
    formats = list(transformer.formats) if transformer.formats is not None else None
    return converted.native, dumped, tuple(transformer.types or ()), formats


params_of_either_kind = st.one_of(
    st.lists(st.one_of(st.integers(-5, 5), st.text(max_size=3), st.none()), max_size=4),
    st.dictionaries(
        st.sampled_from(["a", "b", "c", "d"]),
        st.one_of(st.integers(-5, 5), st.text(max_size=3)),
        max_size=4,
    ),
)


@settings(max_examples=400, deadline=None)
@given(pieces=st.lists(st.sampled_from(PIECES), max_size=12), params=params_of_either_kind)
def test_a_text_and_its_parameters_read_as_psycopg_reads_them(
    pieces: list[str], params: Any
) -> None:
    query = "".join(pieces).encode()
    assert our_reading(query, params) == psycopgs_reading(query, params)


@pytest.mark.parametrize(
    ("text", "params", "native"),
    [
        ("SELECT %(b)s, %(a)s, %(b)s, '100%%'", {"a": 1, "b": 2}, b"SELECT $1, $2, $1, '100%'"),
        ("VALUES (%s, %t, %b)", (1, "x", 2), b"VALUES ($1, $2, $3)"),
        ("SELECT 1", (), b"SELECT 1"),
    ],
)
def test_known_texts(text: str, params: Any, native: bytes) -> None:
    converted = convert(text.encode(), "utf-8")
    assert converted.native == native
    assert our_reading(text.encode(), params) == psycopgs_reading(text.encode(), params)


def test_a_name_used_twice_counts_twice_and_keeps_its_format() -> None:
    converted = convert(b"SELECT %(a)s, %(a)s, %(b)t", "utf-8")
    assert converted.names == ("a", "b")
    assert converted.formats == (PyFormat.AUTO, PyFormat.TEXT)
    assert converted.count == 3


@pytest.mark.parametrize(
    ("text", "params"),
    [
        ("SELECT %(a)s, %(a)t", {"a": 1}),
        ("SELECT %s, %(a)s", {"a": 1}),
        ("SELECT %x", (1,)),
        ("SELECT 5 % 2", ()),
        ("SELECT %(a", {"a": 1}),
        ("SELECT %s, %s", (1,)),
        ("SELECT %(a)s, %(b)s", {"a": 1}),
        ("SELECT %s", {"a": 1}),
        ("SELECT %(a)s, %(a)s", (1, 2)),
        ("SELECT %s", "a"),
    ],
)
def test_a_text_or_parameters_psycopg_refuses_are_refused_with_its_words(
    text: str, params: Any
) -> None:
    refused = psycopgs_reading(text.encode(), params)
    assert isinstance(refused[0], type)
    assert issubclass(refused[0], Exception)
    assert our_reading(text.encode(), params) == refused


def test_parameters_neither_a_sequence_nor_a_mapping_are_named_by_their_type() -> None:
    """psycopg's words here are those of ``len()``; these say what was expected."""
    with pytest.raises(TypeError, match="sequence or a mapping, got int"):
        convert(b"SELECT %s", "utf-8").values(1)
