"""The public API is exactly ``jobguard.__all__``: sorted, complete and documented (STYLE)."""

from __future__ import annotations

import inspect

import jobguard


def _public_members() -> dict[str, object]:
    """Classes and functions reachable as ``jobguard.X`` that jobguard itself defines."""
    members: dict[str, object] = {}
    for name, member in vars(jobguard).items():
        if name.startswith("_") or inspect.ismodule(member):
            continue
        if not (inspect.isclass(member) or inspect.isfunction(member)):
            continue
        if getattr(member, "__module__", "").split(".")[0] == "jobguard":
            members[name] = member
    return members


def test_all_is_sorted_without_duplicates() -> None:
    """STYLE: a sorted ``__all__`` makes additions and removals obvious in review."""
    assert jobguard.__all__ == sorted(set(jobguard.__all__))


def test_every_name_in_all_exists() -> None:
    """``from jobguard import *`` must not fail on a stale name."""
    missing = [name for name in jobguard.__all__ if not hasattr(jobguard, name)]
    assert missing == []


def test_all_lists_every_public_class_and_function_of_the_top_level() -> None:
    """STYLE (httpx's test_exported_members): nothing public is importable but unlisted."""
    assert sorted(set(_public_members()) - set(jobguard.__all__)) == []


def test_the_issue_contract_names_are_exported() -> None:
    """The public API: users' code is written against these names."""
    for name in ("App", "Context", "Retry", "Fatal", "JobStatus"):
        assert name in jobguard.__all__


def test_every_exported_name_has_its_own_docstring() -> None:
    """STYLE 10: every public symbol is documented (its own docstring, not a base class's)."""
    undocumented = []
    for name in jobguard.__all__:
        member = getattr(jobguard, name)
        doc = member.__dict__.get("__doc__") if inspect.isclass(member) else member.__doc__
        # @dataclass fills a missing docstring with the signature, "Name(field: type, ...)".
        if not (doc and doc.strip()) or doc.startswith(f"{member.__name__}("):
            undocumented.append(name)
    assert undocumented == []


def test_public_methods_of_exported_classes_have_docstrings() -> None:
    """STYLE 10: the methods users call (``App.task``, ``Task.enqueue``, ...) are documented."""
    undocumented = []
    for name in jobguard.__all__:
        member = getattr(jobguard, name)
        if not inspect.isclass(member) or issubclass(member, BaseException):
            continue
        for attribute, value in vars(member).items():
            if attribute.startswith("_"):
                continue
            function = value.fget if isinstance(value, property) else value
            if inspect.isfunction(function) and not (function.__doc__ or "").strip():
                undocumented.append(f"{name}.{attribute}")
    assert undocumented == []
