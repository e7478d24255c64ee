"""Unit tests of key templates and idempotency keys in ``jobguard.core.keys`` (G4.1, G4.4)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jobguard.core.keys import (
    MAX_KEY_LENGTH,
    check_key,
    idempotency_key,
    render_key,
    template_fields,
)
from jobguard.exceptions import EnqueueError, KeyTemplateError


def test_a_template_renders_from_the_job_arguments() -> None:
    """G4.1: ``fulfill-order:{order_id}`` names the business action, not the attempt."""
    assert render_key("fulfill-order:{order_id}", {"order_id": 42}) == "fulfill-order:42"
    assert render_key("{tenant}/{sku}", {"tenant": "acme", "sku": "A-1", "qty": 3}) == "acme/A-1"
    assert render_key("fixed-key", {}) == "fixed-key"


def test_template_fields_lists_the_argument_names_in_order() -> None:
    """G4.1: the task checks these names against its handler at registration."""
    assert template_fields("{a}:{b}:{a}") == ["a", "b", "a"]
    assert template_fields("{{literal}}") == []


def test_a_template_naming_a_missing_argument_is_an_error() -> None:
    """G4.1: a key that names a missing argument fails at enqueue, not at run time."""
    with pytest.raises(KeyTemplateError, match="order_id"):
        render_key("fulfill-order:{order_id}", {"orderid": 42})


@pytest.mark.parametrize(
    ("value", "kind"),
    [
        (1700000000.25, "float"),
        (None, "NoneType"),
        ([1, 2], "list"),
        ({"b": 1, "a": 2}, "dict"),
        ((1,), "tuple"),
    ],
)
def test_a_key_built_from_an_unstable_value_is_an_error(value: Any, kind: str) -> None:
    """G4.1: timestamps, None and unordered JSON never become part of an operation key."""
    with pytest.raises(KeyTemplateError, match=kind):
        render_key("op:{x}", {"x": value})


def test_booleans_render_as_stable_lowercase_words() -> None:
    """G4.1: ``True`` and ``1`` must not collide, and the text is the same on every platform."""
    assert render_key("op:{flag}", {"flag": True}) == "op:true"
    assert render_key("op:{flag}", {"flag": False}) == "op:false"
    assert render_key("op:{flag}", {"flag": 1}) == "op:1"


@pytest.mark.parametrize(
    "template",
    [
        "op:{x:>8}",  # format spec
        "op:{x!r}",  # conversion
        "op:{x.real}",  # attribute access
        "op:{x[0]}",  # indexing
        "op:{}",  # positional
        "op:{0}",  # positional by number
        "op:{x",  # malformed
        "op:x}",  # malformed
    ],
)
def test_templates_that_are_not_plain_field_names_are_refused(template: str) -> None:
    """G4.1: only ``{name}`` fields; anything that could render differently is refused."""
    with pytest.raises(KeyTemplateError):
        render_key(template, {"x": 5})


@pytest.mark.parametrize("key", ["", "   ", "x" * (MAX_KEY_LENGTH + 1)])
def test_empty_or_overlong_keys_are_refused(key: str) -> None:
    """G4.1: a key must identify something and fit the stores' indexes."""
    with pytest.raises(KeyTemplateError):
        check_key(key, "operation_key")


def test_a_template_that_renders_empty_is_refused() -> None:
    """G4.1: ``{x}`` with ``x=""`` would make every such job share one empty key."""
    with pytest.raises(KeyTemplateError):
        render_key("{x}", {"x": ""})


def test_key_template_errors_are_enqueue_errors() -> None:
    """Exception tree: callers that catch EnqueueError catch bad keys too."""
    assert issubclass(KeyTemplateError, EnqueueError)


def test_idempotency_key_is_stable_and_distinct_per_operation_and_name() -> None:
    """G4.4: the same operation and name always give the same external key; others differ."""
    key = idempotency_key("fulfill-order:42", "email")
    assert key == idempotency_key("fulfill-order:42", "email")
    assert key != idempotency_key("fulfill-order:42", "sms")
    assert key != idempotency_key("fulfill-order:43", "email")
    assert re.fullmatch(r"jg-[0-9a-f]{32}", key)


# Keys are stored as UTF-8 text, so lone surrogates never reach this function.
NAMES = st.text(
    alphabet=st.characters(exclude_characters="\x00", exclude_categories=["Cs"]),
    min_size=1,
    max_size=20,
)


@settings(max_examples=300, derandomize=True, database=None)
@given(first=st.tuples(NAMES, NAMES), second=st.tuples(NAMES, NAMES))
def test_idempotency_keys_are_short_ascii_and_distinct_for_distinct_pairs(
    first: tuple[str, str], second: tuple[str, str]
) -> None:
    """G4.4: always API-safe text; ``("a:b", "c")`` and ``("a", "b:c")`` never share a key."""
    key = idempotency_key(*first)
    assert re.fullmatch(r"jg-[0-9a-f]{32}", key)
    assert (key == idempotency_key(*second)) == (first == second)


def test_key_with_an_unpaired_surrogate_is_a_key_error_not_a_unicode_crash() -> None:
    """Text that cannot be stored or hashed is refused at enqueue, with the key's name."""
    with pytest.raises(KeyTemplateError, match="dedup_key"):
        check_key("order:\ud800", "dedup_key")
