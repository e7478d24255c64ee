"""Validation of everything a request brings: query parameters, path ids, form fields.

Each reader returns a clean value or raises :class:`BadRequest` with a sentence naming the
parameter and what is wrong, which the app shows as a 400 page. Nothing unvalidated reaches the
store, and no value is unbounded.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace
from urllib.parse import parse_qs

from jobguard.core.keys import MAX_KEY_LENGTH
from jobguard.core.selection import DeadFilter
from jobguard.models import JobStatus
from jobguard.task import QUEUE_NAME, TASK_NAME

MAX_PAGE = 1000
MAX_QUERY_LENGTH = 2048
MAX_ID = 2**63 - 1
PAGE_SIZE = 50
MAX_QUERY_FIELDS = 20


class BadRequest(Exception):
    """The request is malformed: shown as a 400 page with this message."""

    status_code = 400


class NotFound(BadRequest):
    """What the request names does not exist: shown as a 404 page."""

    status_code = 404


def query(text: str, max_fields: int = MAX_QUERY_FIELDS) -> dict[str, list[str]]:
    """The parameters of a query string (blank values kept), at most ``max_fields`` of them."""
    try:
        return parse_qs(text, keep_blank_values=True, max_num_fields=max_fields)
    except ValueError:
        raise BadRequest(
            f"too many query parameters: this page takes at most {max_fields}"
        ) from None


def single(params: Mapping[str, list[str]], name: str) -> str | None:
    """The one value of ``name`` (``None`` if absent or empty); given twice is an error."""
    values = params.get(name, [])
    if len(values) > 1:
        raise BadRequest(f"parameter {name!r} is given {len(values)} times; give it once")
    value = values[0].strip() if values else ""
    return value or None


def integer(text: str, name: str, low: int, high: int) -> int:
    """An integer ``low..high`` written in decimal digits."""
    if not text.isdigit() or not text.isascii() or len(text) > 19:
        raise BadRequest(f"{name} must be a whole number from {low} to {high}, not {text[:40]!r}")
    value = int(text)
    if not low <= value <= high:
        raise BadRequest(f"{name} must be from {low} to {high}, not {value}")
    return value


def page(params: Mapping[str, list[str]]) -> int:
    """``page``: 1 to :data:`MAX_PAGE` (default 1)."""
    text = single(params, "page")
    return 1 if text is None else integer(text, "page", 1, MAX_PAGE)


def job_id(text: str) -> int:
    """A job id from the path: a positive whole number."""
    return integer(text, "the job id", 1, MAX_ID)


def status(params: Mapping[str, list[str]]) -> JobStatus | None:
    """``status``: one of the job states, or absent."""
    text = single(params, "status")
    if text is None:
        return None
    try:
        return JobStatus(text)
    except ValueError:
        known = ", ".join(s.value for s in JobStatus)
        raise BadRequest(f"status must be one of {known}, not {text[:40]!r}") from None


def name(params: Mapping[str, list[str]], what: str) -> str | None:
    """``queue`` or ``task``: a plain name as accepted at enqueue, or absent."""
    text = single(params, what)
    if text is None:
        return None
    pattern = QUEUE_NAME if what == "queue" else TASK_NAME
    if not pattern.fullmatch(text):
        raise BadRequest(f"{what} {text[:40]!r} is not a valid {what} name")
    return text


def key(params: Mapping[str, list[str]], what: str = "key") -> str | None:
    """An operation key: printable text of at most the store's key length, or absent."""
    text = single(params, what)
    if text is None:
        return None
    if len(text) > MAX_KEY_LENGTH or not text.isprintable():
        raise BadRequest(f"{what} must be printable text of at most {MAX_KEY_LENGTH} characters")
    return text


def since_s(params: Mapping[str, list[str]], default: int) -> int:
    """``since``: a look-back window in seconds, 60 s to 30 days."""
    text = single(params, "since")
    return default if text is None else integer(text, "since (seconds)", 60, 30 * 86400)


def check_known(params: Mapping[str, list[str]], known: set[str]) -> None:
    """Refuse parameters the page does not take (a typo would otherwise be silently ignored)."""
    unknown = sorted(set(params) - known)
    if unknown:
        accepted = ", ".join(sorted(known)) or "none"
        raise BadRequest(f"unknown parameter {unknown[0][:40]!r} (this page takes: {accepted})")


SELECTION_FIELDS = ("task", "queue", "reason", "since", "until", "all")


def selection(params: Mapping[str, list[str]]) -> DeadFilter:
    """A bulk DLQ selection (#17): ``task``, ``queue``, ``reason``, ``since``, ``until`` (ISO
    8601) or ``all=1``; at least one filter or ``all``, not both."""
    task = name(params, "task")
    queue = name(params, "queue")
    texts = {what: single(params, what) for what in ("reason", "since", "until")}
    every = single(params, "all") == "1"
    given = task is not None or queue is not None or any(v is not None for v in texts.values())
    if every and given:
        raise BadRequest("'every dead job' selects them all: clear the filters, or untick it")
    if not every and not given:
        raise BadRequest("choose at least one filter, or tick 'every dead job'")
    return DeadFilter.parse(task=task, queue=queue, **texts)  # ConfigurationError: a 400


_CUTOFF = re.compile(r"[0-9]{1,12}(\.[0-9]{1,20})?")


def cutoff_text(selection: DeadFilter) -> str:
    """The preview's store time as the confirm form carries it (exact: ``repr`` of a float)."""
    return repr(selection.cutoff)


def confirmed(fields: Mapping[str, list[str]]) -> DeadFilter:
    """The selection a bulk form confirms: its filters and the preview's ``cutoff``, so that
    only jobs the preview could show (buried before it) are touched."""
    selected = selection(fields)
    text = single(fields, "cutoff")
    if text is None:
        raise BadRequest("this form has no preview time (cutoff): preview the selection first")
    if not _CUTOFF.fullmatch(text):
        raise BadRequest(f"cutoff must be the preview's store time in seconds, not {text[:40]!r}")
    return replace(selected, cutoff=float(text))


def selection_fields(params: Mapping[str, list[str]]) -> dict[str, str]:
    """The selection's form fields as the operator typed them, to carry into the next form (it
    is validated again there)."""
    return {what: (single(params, what) or "") for what in SELECTION_FIELDS}
