"""Operation, resource, dedup and idempotency keys (G4.1, G4.4, G6).

A key template is a ``str.format`` string over the task's arguments. Only plain field names are
allowed (no ``{x.attr}``, ``{x[0]}``, conversions or format specs) and only values whose text is
stable across attempts: strings, integers and booleans. Floats (timestamps), ``None``, lists and
objects (unordered JSON) are refused at enqueue, which is when a bad key is cheapest to fix.
"""

from __future__ import annotations

import hashlib
import string
from collections.abc import Mapping
from typing import Any

from jobguard.core import checks
from jobguard.exceptions import KeyTemplateError

MAX_KEY_LENGTH = 512
_FORMATTER = string.Formatter()


def template_fields(template: str) -> list[str]:
    """Names of the fields a key template refers to; raise if the template is not plain."""
    fields: list[str] = []
    try:
        parsed = list(_FORMATTER.parse(template))
    except ValueError as exc:
        raise KeyTemplateError(f"key template {template!r} is malformed: {exc}") from exc
    for _literal, name, spec, conversion in parsed:
        if name is None:
            continue
        if not name.isidentifier():
            raise KeyTemplateError(
                f"key template {template!r}: field {{{name}}} must be a plain argument name"
            )
        if spec or conversion:
            raise KeyTemplateError(
                f"key template {template!r}: field {{{name}}} may not use a format spec or "
                "conversion"
            )
        fields.append(name)
    return fields


def stable_text(name: str, value: Any, template: str) -> str:
    """Text of one key part, refusing values whose text is not stable across attempts."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | str):
        return str(value)
    raise KeyTemplateError(
        f"key template {template!r}: argument {name!r} is a {type(value).__name__}; key parts "
        "must be str, int or bool so the key is the same on every attempt"
    )


def render_key(template: str, arguments: Mapping[str, Any]) -> str:
    """Build a key from its template and the job's arguments (done once, at enqueue)."""
    parts: dict[str, str] = {}
    for name in template_fields(template):
        if name not in arguments:
            raise KeyTemplateError(
                f"key template {template!r} needs argument {name!r}, which the job does not have"
            )
        parts[name] = stable_text(name, arguments[name], template)
    return check_key(template.format(**parts), "key")


def check_key(key: str, what: str) -> str:
    """Validate a literal key given per call; return it unchanged."""
    problem = checks.text_problem(key)
    if problem is not None:
        raise KeyTemplateError(f"{what} {problem}")
    if len(key) > MAX_KEY_LENGTH:
        raise KeyTemplateError(f"{what} is longer than {MAX_KEY_LENGTH} characters")
    return key


def idempotency_key(operation_key: str, name: str) -> str:
    """A key for an external API, stable across attempts and replays of one operation (G4.4).

    Hashed so it fits the length and alphabet limits common to payment and mail APIs.
    """
    digest = hashlib.blake2b(f"{operation_key}\x00{name}".encode(), digest_size=16).hexdigest()
    return f"jg-{digest}"
