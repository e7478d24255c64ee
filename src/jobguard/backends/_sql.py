"""Load named SQL statements from ``.sql`` files shipped in the package.

A file holds statements separated by ``-- name: NAME`` lines; comments directly under the name
document the statement. Loaded once per backend class, never built with string formatting.
"""

from __future__ import annotations

import re
from importlib import resources

_NAME = re.compile(r"^--\s*name:\s*(?P<name>[a-z_][a-z0-9_]*)\s*$", re.MULTILINE)


def parse_queries(text: str) -> dict[str, str]:
    """Split a queries file into ``{name: statement}``; duplicate names are an error."""
    queries: dict[str, str] = {}
    matches = list(_NAME.finditer(text))
    for index, match in enumerate(matches):
        end = matches[index + 1].start() if index + 1 < len(matches) else len(text)
        body = text[match.end() : end].strip()
        name = match.group("name")
        if name in queries:
            raise ValueError(f"query {name!r} is defined twice")
        if not body:
            raise ValueError(f"query {name!r} is empty")
        queries[name] = body
    return queries


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
