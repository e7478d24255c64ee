"""JSON values that come back exactly as they went in (guarantees G5.4 and G12).

Job arguments and step results cross the store as JSON. Two things go wrong silently there:
nesting so deep that encoding or decoding raises ``RecursionError`` in the worker, and values
that JSON gives back changed (a tuple as a list, ``{1: "a"}`` as ``{"1": "a"}``, an enum as its
value). Both are found here, without recursion, before anything is stored.
"""

from __future__ import annotations

import json
import math
from typing import Any

# Deep enough for any real document; far from Python's recursion limit in json.dumps/loads.
MAX_NESTING = 64

_SCALARS = (str, int, float, bool, type(None))


def too_deep(value: Any, limit: int = MAX_NESTING) -> bool:
    """Whether ``value`` nests lists and dicts more than ``limit`` levels (no recursion)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        current, depth = stack.pop()
        if isinstance(current, dict):
            children: Any = current.values()
        elif isinstance(current, list | tuple):
            children = current
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def _where(path: str) -> str:
    return f" at {path}" if path else ""


def _scalar_problem(value: Any, path: str) -> str | None:
    if type(value) is float and not math.isfinite(value):
        return f"{path} is {value!r}, which JSON cannot represent"
    return None


def _key_problem(key: Any, path: str) -> str | None:
    if type(key) is not str:
        return (
            f"{path} has the {type(key).__name__} key {key!r}; JSON keys are text, so it would "
            "come back as a str key"
        )
    return None


def _container_problem(kind: type, path: str) -> str:
    if kind is tuple:
        return f"{path} is a tuple, which JSON gives back as a list"
    return (
        f"{path} is a {kind.__name__}; only dict (str keys), list, str, int, float, bool and "
        "None come back from JSON unchanged"
    )


def inexact_part(value: Any, root: str = "result") -> str | None:
    """Why ``value`` would not come back from JSON exactly equal and of the same types, or ``None``.

    Only ``dict`` with ``str`` keys, ``list``, ``str``, ``int``, finite ``float``, ``bool`` and
    ``None`` (of exactly these types, not subclasses) survive the trip unchanged.
    """
    stack: list[tuple[Any, str, int]] = [(value, root, 1)]
    while stack:
        current, path, depth = stack.pop()
        kind = type(current)
        problem: str | None
        if kind in _SCALARS:
            problem = _scalar_problem(current, path)
        elif depth > MAX_NESTING:
            problem = f"{path} nests deeper than {MAX_NESTING} levels"
        elif kind is list:
            problem = None
            stack.extend((item, f"{path}[{i}]", depth + 1) for i, item in enumerate(current))
        elif kind is dict:
            problem = next(filter(None, (_key_problem(key, path) for key in current)), None)
            stack.extend((item, f"{path}[{key!r}]", depth + 1) for key, item in current.items())
        else:
            problem = _container_problem(kind, path)
        if problem is not None:
            return problem
    return None


def decode_object(payload: Any) -> dict[str, Any] | str:
    """A stored payload decoded to a JSON object, or why it cannot be (never raises).

    Whatever shape a row planted behind jobguard's back has (not text, not JSON, not an object,
    nested past the limit), the answer is a reason a person can act on.
    """
    if not isinstance(payload, str | bytes):
        return f"payload is not JSON text but {type(payload).__name__}"
    try:
        decoded = json.loads(payload)
    except ValueError as exc:
        return f"payload is not valid JSON: {exc}"
    except RecursionError:
        return f"payload nests too deeply to decode (the limit at enqueue is {MAX_NESTING})"
    if not isinstance(decoded, dict):
        return f"payload is not a JSON object but {type(decoded).__name__}"
    if too_deep(decoded):
        return f"payload nests deeper than {MAX_NESTING} levels (the limit at enqueue)"
    return decoded
