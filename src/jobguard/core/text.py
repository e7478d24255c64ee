"""Text from handlers made safe to store and safe to show (guarantees G12 and G14).

Handlers hand jobguard text it does not control: exception messages, tracebacks, external
references. Before it is stored, text loses what no store accepts (lone surrogates, which are
not encodable as UTF-8, and NUL characters) and is bounded in length. Before it is shown on an
operator's terminal, control characters are written as escapes, so a stored error message can
neither retitle nor clear the terminal.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

REPLACEMENT = "\ufffd"
# Longest stored error message, reason or reference; tracebacks get more room.
MAX_TEXT_CHARS = 8_000
MAX_TRACEBACK_CHARS = 64_000

_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
# C0 controls and DEL and C1 controls, plus lone surrogates; newline and tab are kept where
# multi-line text is shown (see ``escape_controls``).
_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")
_CONTROLS_BUT_LINES = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")


def storable(text: str, limit: int = MAX_TEXT_CHARS) -> str:
    """``text`` with lone surrogates and NUL replaced by U+FFFD, cut to ``limit`` characters."""
    cleaned = _UNSTORABLE.sub(REPLACEMENT, text)
    if len(cleaned) > limit:
        cut = len(cleaned) - limit
        cleaned = cleaned[:limit] + f"... [{cut} more characters not stored]"
    return cleaned


def describe(exc: BaseException) -> str:
    """``str(exc)``, even for an exception whose ``__str__`` itself raises, made storable."""
    try:
        text = str(exc)
    except Exception as error:  # a hostile __str__ must not take the pipeline down with it
        text = f"<unprintable {type(exc).__name__}: str() raised {type(error).__name__}>"
    return storable(text)


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    code = ord(char)
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def escape_controls(text: str, *, keep_lines: bool = False) -> str:
    """``text`` with control characters shown as ``\\xNN`` escapes, for a terminal.

    With ``keep_lines`` newlines and tabs stay (tracebacks, indented JSON).
    """
    pattern = _CONTROLS_BUT_LINES if keep_lines else _CONTROLS
    return pattern.sub(_escape, text)


def utc_text(ts: float, fmt: str = "%Y-%m-%d %H:%M:%S") -> str:
    """Store seconds as UTC text in ``fmt``; a number no date can express (infinite, NaN, past
    year 9999: a row this version did not write) is shown as the number it is."""
    try:
        return datetime.fromtimestamp(ts, tz=UTC).strftime(fmt)
    except (OverflowError, ValueError, OSError):
        return f"{ts:g} (not a date)"
