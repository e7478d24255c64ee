"""Load named SQL statements from ``.sql`` files shipped in the package.

A file holds statements separated by ``-- name: NAME`` lines; comments directly under the name
document the statement. A condition several statements share is written once, under a
``-- part: NAME`` line, and each statement names it as ``{part:NAME}`` where it stands; the
file is whole once loaded (its parts put in place), never built with string formatting.
"""

from __future__ import annotations

import re
from importlib import resources

_NAME = re.compile(r"^--\s*(?P<kind>name|part):\s*(?P<name>[a-z_][a-z0-9_]*)\s*$", re.MULTILINE)
_PART_USE = re.compile(r"\{part:(?P<name>[a-z_][a-z0-9_]*)\}")


def parse_queries(text: str) -> dict[str, str]:
    """Split a queries file into ``{name: statement}``, each part it names put in place.

    A name defined twice, an empty block, a part no statement names and a part named but
    not defined are errors, raised when the file is loaded.
    """
    blocks: dict[str, dict[str, str]] = {"name": {}, "part": {}}
    matches = list(_NAME.finditer(text))
    for index, match in enumerate(matches):
        end = matches[index + 1].start() if index + 1 < len(matches) else len(text)
        body = text[match.end() : end].strip()
        kind, name = match.group("kind", "name")
        label = "query" if kind == "name" else "part"
        if name in blocks[kind]:
            raise ValueError(f"{label} {name!r} is defined twice")
        if not body:
            raise ValueError(f"{label} {name!r} is empty")
        blocks[kind][name] = body
    parts, unused = blocks["part"], set(blocks["part"])

    def put_in_place(use: re.Match[str]) -> str:
        name = use.group("name")
        if name not in parts:
            raise ValueError(f"part {name!r} is used but not defined")
        unused.discard(name)
        return _uncommented(parts[name])

    queries = {name: _PART_USE.sub(put_in_place, body) for name, body in blocks["name"].items()}
    if unused:
        raise ValueError(f"part {sorted(unused)[0]!r} is defined but no query uses it")
    return queries


def _uncommented(part: str) -> str:
    """A part without the comment lines that document it in the file."""
    return "\n".join(line for line in part.splitlines() if not line.lstrip().startswith("--"))


def load_queries(package: str, filename: str = "queries.sql") -> dict[str, str]:
    """Read and parse the named queries of a backend package."""
    return parse_queries(resources.files(package).joinpath(filename).read_text("utf-8"))


def load_migrations(package: str) -> list[tuple[int, str, str]]:
    """Return ``(version, name, sql)`` for each ``migrations/NNNN_name.sql``, in order."""
    folder = resources.files(package).joinpath("migrations")
    found: list[tuple[int, str, str]] = []
    for entry in folder.iterdir():
        match = re.fullmatch(r"(\d{4})_([a-z0-9_]+)\.sql", entry.name)
        if match:
            found.append((int(match.group(1)), match.group(2), entry.read_text("utf-8")))
    found.sort()
    versions = [version for version, _, _ in found]
    if versions != list(range(1, len(versions) + 1)):
        raise ValueError(f"migrations of {package} are not numbered 1..n: {versions}")
    return found
