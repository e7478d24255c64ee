"""Whether a job's arguments fit its handler, answered as ``inspect.Signature.bind`` would.

Every enqueue and every delivery asks it. Binding builds a ``BoundArguments`` and walks every
parameter each time; the names a handler takes by keyword after its ``ctx`` are read once
instead, so arguments that plainly fit are answered by two set comparisons, and anything else
(a missing or unknown name, a ``**kwargs`` handler given extra names) by ``bind`` itself, whose
message names what is wrong.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

_BY_KEYWORD = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
_FIRST_BY_POSITION = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


class KeywordFit:
    """The keyword arguments a handler takes after its first (``ctx``), read from its signature.

    Args:
        signature: The handler's signature.
    """

    def __init__(self, signature: inspect.Signature) -> None:
        self._signature = signature
        params = list(signature.parameters.values())
        rest = params[1:]
        # Where a name set alone cannot tell (no first positional parameter to take ctx, or a
        # later positional-only one that no keyword can fill), every answer is bind's.
        self._plain = (
            bool(params)
            and params[0].kind in _FIRST_BY_POSITION
            and not any(
                p.kind is inspect.Parameter.POSITIONAL_ONLY and p.default is p.empty for p in rest
            )
        )
        self._names = frozenset(p.name for p in rest if p.kind in _BY_KEYWORD)
        self._required = frozenset(
            p.name for p in rest if p.kind in _BY_KEYWORD and p.default is p.empty
        )

    def mismatch(self, arguments: Mapping[str, Any]) -> str | None:
        """Why the handler cannot be called as ``handler(ctx, **arguments)``, or ``None``."""
        names = arguments.keys()
        if self._plain and names >= self._required and names <= self._names:
            return None
        try:
            self._signature.bind(None, **arguments)
        except TypeError as exc:
            return str(exc)
        return None
