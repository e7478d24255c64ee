"""The docs' links land on a heading that exists, and their citations do not repeat."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from tests.e2e.test_docs_examples import DOCUMENTS

_LINK = re.compile(r"\]\(([^)#:\s]*)#([^)\s]+)\)")
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$")
_CITATIONS = re.compile(r"\(((?:G\d+(?:\.\d+)*)(?:,\s*G\d+(?:\.\d+)*)+)")


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as dashes."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", lambda m: m.group(1) or "", heading).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(document: Path) -> set[str]:
    """Every anchor of a Markdown document's headings (repeats get ``-1``, ``-2``, ...)."""
    seen: Counter[str] = Counter()
    found = set()
    fenced = False
    for line in document.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        match = None if fenced else _HEADING.match(line)
        if match:
            base = slug(match.group(1))
            found.add(base if not seen[base] else f"{base}-{seen[base]}")
            seen[base] += 1
    return found


def test_a_heading_anchor_is_what_github_makes() -> None:
    assert slug("Resource locks and fencing tokens (G3)") == "resource-locks-and-fencing-tokens-g3"
    assert slug("`jobguard doctor` and `app.diagnose()`") == "jobguard-doctor-and-appdiagnose"
    assert slug("Findings and `--json`") == "findings-and---json"


def test_every_link_to_a_heading_lands_on_one() -> None:
    broken = []
    for document in DOCUMENTS:
        for target, anchor in _LINK.findall(document.read_text()):
            linked = (document.parent / target) if target else document
            if linked.suffix == ".md" and anchor not in anchors(linked):
                broken.append(f"{document.name} -> {target or document.name}#{anchor}")
    assert broken == []


def test_no_citation_names_a_guarantee_twice() -> None:
    repeated = []
    for document in DOCUMENTS:
        text = document.read_text()
        for group in _CITATIONS.findall(text):
            names = [name.strip() for name in group.split(",")]
            if len(set(names)) < len(names):
                repeated.append(f"{document.name}: ({group})")
    assert repeated == []


def test_the_diagnostics_page_points_at_the_dashboard_and_the_exporter() -> None:
    """Both exist: the page must not say otherwise, and links to them."""
    text = (DOCUMENTS[0].parent / "docs" / "diagnostics.md").read_text()
    assert "no dashboard" not in text
    assert "](dashboard.md#pages)" in text
    assert "](observability.md#the-stores-gauges-jobguard-exporter)" in text


def test_every_error_the_docs_name_is_importable_from_jobguard() -> None:
    """A handler catches what the docs tell it about as ``from jobguard import X``."""
    import inspect

    import jobguard
    from jobguard import exceptions

    errors = {
        name
        for name, value in vars(exceptions).items()
        if inspect.isclass(value) and issubclass(value, BaseException)
    }
    named = {
        name
        for document in DOCUMENTS
        for name in re.findall(r"`(\w+)`", document.read_text())
        if name in errors
    }
    assert sorted(named - set(jobguard.__all__)) == []


def test_every_user_extra_installs_only_what_jobguard_imports() -> None:
    """An extra a user installs (``pip install 'jobguard[X]'``) brings drivers jobguard uses."""
    import tomllib

    root = DOCUMENTS[0].parent
    extras = tomllib.loads((root / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    source = "\n".join(p.read_text() for p in (root / "src" / "jobguard").rglob("*.py"))
    unused = []
    for extra, requirements in extras.items():
        if extra in ("bench", "dev"):  # the project's own tools, not a user's install
            continue
        for requirement in requirements:
            module = re.split(r"[\[<>=~ ]", requirement, maxsplit=1)[0].split("-")[0]
            module = {"psycopg": "psycopg", "prometheus": "prometheus_client"}.get(module, module)
            if not re.search(rf"^\s*(?:from|import) {module}\b", source, re.MULTILINE):
                unused.append(f"{extra}: {requirement}")
    assert unused == []


def test_the_sqlite_section_documents_transactional_enqueue() -> None:
    """Transactional enqueue works on SQLite too (``tests/e2e/test_transactional_enqueue.py``)."""
    text = (DOCUMENTS[0].parent / "docs" / "backends.md").read_text()
    sqlite_part = text[text.index("## SQLite") : text.index("## PostgreSQL")]
    assert "connection=conn" in sqlite_part
