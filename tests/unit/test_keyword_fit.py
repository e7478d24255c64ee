"""A job's arguments fit its handler exactly when ``inspect.Signature.bind`` says they do.

The check runs at every enqueue and every delivery, from names read once off the signature;
whatever the handler's parameters (positional-only, keyword-only, defaults, ``*args``,
``**kwargs``) and whatever names a payload brings, its answer is bind's, message included.
"""

from __future__ import annotations

import inspect
from typing import Any

from hypothesis import assume, example, given
from hypothesis import strategies as st

from jobguard.core.calls import KeywordFit

P = inspect.Parameter
NAMES = ("ctx", "a", "b", "c", "d")
KINDS = (
    P.POSITIONAL_ONLY,
    P.POSITIONAL_OR_KEYWORD,
    P.VAR_POSITIONAL,
    P.KEYWORD_ONLY,
    P.VAR_KEYWORD,
)


@st.composite
def signatures(draw: st.DrawFn) -> inspect.Signature:
    names = draw(st.lists(st.sampled_from(NAMES), min_size=0, max_size=5, unique=True))
    kinds = sorted(draw(st.lists(st.sampled_from(KINDS), min_size=len(names), max_size=len(names))))
    params = []
    for name, kind in zip(names, kinds, strict=True):
        has_default = kind not in (P.VAR_POSITIONAL, P.VAR_KEYWORD) and draw(st.booleans())
        params.append(P(name, kind, default=0 if has_default else P.empty))
    try:
        return inspect.Signature(params)
    except ValueError:  # a positional parameter without a default after one with
        assume(False)
        raise


def bind_says(signature: inspect.Signature, arguments: dict[str, Any]) -> str | None:
    try:
        signature.bind(None, **arguments)
    except TypeError as exc:
        return str(exc)
    return None


@given(signatures(), st.dictionaries(st.sampled_from((*NAMES, "e")), st.integers(), max_size=5))
# A positional-only parameter after ctx, which no keyword fills; ctx keyword-only; ctx by name.
@example(inspect.Signature([P("ctx", P.POSITIONAL_ONLY), P("a", P.POSITIONAL_ONLY)]), {})
@example(inspect.Signature([P("ctx", P.KEYWORD_ONLY), P("a", P.KEYWORD_ONLY)]), {"a": 1})
@example(inspect.Signature([P("ctx", P.POSITIONAL_OR_KEYWORD)]), {"ctx": 1})
def test_the_answer_is_binds(signature: inspect.Signature, arguments: dict[str, Any]) -> None:
    assert KeywordFit(signature).mismatch(arguments) == bind_says(signature, arguments)


class CountedSignature(inspect.Signature):
    """A signature that counts the binds asked of it."""

    binds = 0

    def bind(self, *args: Any, **kwargs: Any) -> inspect.BoundArguments:
        type(self).binds += 1
        return super().bind(*args, **kwargs)


def test_a_plain_handler_is_answered_without_binding() -> None:
    def handler(ctx: Any, order: int, note: str = "") -> None: ...

    CountedSignature.binds = 0
    fit = KeywordFit(CountedSignature(list(inspect.signature(handler).parameters.values())))
    assert fit.mismatch({"order": 1}) is None
    assert fit.mismatch({"order": 1, "note": "x"}) is None
    assert CountedSignature.binds == 0
    assert fit.mismatch({"note": "x"}) == "missing a required argument: 'order'"
    assert fit.mismatch({"order": 1, "other": 2}) == "got an unexpected keyword argument 'other'"
    assert CountedSignature.binds == 2
