"""Values that cross the store: exact JSON, bounded nesting, storable and showable text."""

from __future__ import annotations

import enum
import json
import math
from collections import OrderedDict
from pathlib import Path
from typing import Any

import pytest

from jobguard import App, Context, PayloadError
from jobguard.core.jsonvalues import MAX_NESTING, decode_object, inexact_part, too_deep
from jobguard.core.text import describe, escape_controls, storable


class Colour(enum.IntEnum):
    """An int to ``==``, but not once JSON gave it back."""

    RED = 1


def nested(depth: int) -> Any:
    """A list nested ``depth`` levels deep."""
    value: Any = []
    for _ in range(depth - 1):
        value = [value]
    return value


@pytest.mark.parametrize(
    "value",
    [
        None,
        True,
        0,
        -(2**70),
        1.5,
        "t\u00e9xt \U0001f600 \x00 \ud800",
        [1, [2.0, None]],
        {"a": {"b": [True]}},
    ],
)
def test_json_values_of_exact_types_come_back_equal_and_of_the_same_types(value: Any) -> None:
    """What ``inexact_part`` accepts survives dumps/loads unchanged (the step memo's promise)."""
    assert inexact_part(value) is None
    back = json.loads(json.dumps(value))
    assert back == value
    assert json.dumps(back) == json.dumps(value)


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ((1, 2), "result is a tuple, which JSON gives back as a list"),
        ({1: "a"}, "result has the int key 1; JSON keys are text"),
        ({"a": [1, (2,)]}, "result['a'][1] is a tuple"),
        (Colour.RED, "result is a Colour"),
        (OrderedDict(a=1), "result is a OrderedDict"),
        ({"x": math.nan}, "result['x'] is nan, which JSON cannot represent"),
        ({1, 2}, "result is a set"),
        (nested(MAX_NESTING + 1), f"nests deeper than {MAX_NESTING} levels"),
    ],
)
def test_values_json_would_change_are_named_with_where_they_are(value: Any, problem: str) -> None:
    """A tuple, an int key, an enum, a subclass, NaN, a set or too deep: refused, with a path."""
    found = inexact_part(value)
    assert found is not None
    assert problem in found


def test_nesting_is_measured_without_recursion() -> None:
    """A million levels are measured without RecursionError."""
    assert too_deep(nested(1_000_000))
    assert not too_deep(nested(MAX_NESTING))
    assert too_deep(nested(MAX_NESTING + 1))


def test_arguments_nested_past_the_limit_are_refused_at_enqueue(tmp_path: Path) -> None:
    """Deep JSON arguments fail at ``enqueue`` with a clear error, before the store is opened."""
    app = App(f"sqlite:///{tmp_path / 'never.db'}")

    @app.task(name="t")
    def t(ctx: Context, doc: Any) -> None: ...

    with pytest.raises(PayloadError, match=f"nest deeper than {MAX_NESTING} levels"):
        t.enqueue(doc=nested(100_000))
    assert t.build_spec({"doc": nested(MAX_NESTING - 1)}, t.options().call_options)
    assert not (tmp_path / "never.db").exists()


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        ("[" * 100_000 + "]" * 100_000, "payload nests too deeply to decode"),
        (json.dumps({"a": nested(MAX_NESTING + 1)}), "payload nests deeper than"),
        (None, "payload is not JSON text but NoneType"),
        (b"\xff", "payload is not valid JSON"),
        ("[1]", "payload is not a JSON object but list"),
    ],
)
def test_a_stored_payload_of_any_shape_decodes_or_says_why(payload: Any, reason: str) -> None:
    """``decode_object`` never raises, whatever was planted in the row."""
    decoded = decode_object(payload)
    assert isinstance(decoded, str)
    assert decoded.startswith(reason)


def test_text_is_made_storable_and_bounded() -> None:
    """Lone surrogates and NUL become U+FFFD; very long text is cut, saying how much."""
    assert storable("a\ud800b\x00c\udfff") == "a\ufffdb\ufffdc\ufffd"
    storable("x\udc80").encode("utf-8")  # encodes now
    cut = storable("y" * 20, limit=5)
    assert cut == "yyyyy... [15 more characters not stored]"


def test_an_exception_whose_str_raises_is_still_described() -> None:
    """A hostile ``__str__`` does not take the pipeline down."""

    class Hostile(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no")

    assert describe(Hostile()) == "<unprintable Hostile: str() raised RuntimeError>"


def test_control_characters_are_shown_escaped() -> None:
    """ESC, BEL, CR, C1 and surrogates are written as escapes; newlines kept where asked."""
    shown = escape_controls("\x1b]0;pwned\x07\x1b[2J\r\x9b\ud800ok\n")
    assert shown == "\\x1b]0;pwned\\x07\\x1b[2J\\x0d\\x9b\\ud800ok\\x0a"
    assert escape_controls("a\n\tb\x1b", keep_lines=True) == "a\n\tb\\x1b"
