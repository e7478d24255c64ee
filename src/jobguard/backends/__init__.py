"""Storage backends and the URL that picks one."""

from __future__ import annotations

from urllib.parse import urlparse

from jobguard.backends.base import Backend
from jobguard.exceptions import ConfigurationError

DEFAULT_URL = "sqlite:///jobguard.db"


def sqlite_path(url: str) -> str:
    """The file path of a ``sqlite:///path`` URL (relative) or ``sqlite:////abs/path``."""
    prefix = "sqlite:///"
    if not url.startswith(prefix) or len(url) == len(prefix):
        raise ConfigurationError(
            f"SQLite URL must look like sqlite:///path/to/file.db, got {url!r}"
        )
    return url[len(prefix) :]


def open_backend(url: str | None = None) -> Backend:
    """Open the backend a URL names. Today: ``sqlite:///path`` (the default)."""
    url = url or DEFAULT_URL
    scheme = urlparse(url).scheme
    if scheme == "sqlite":
        from jobguard.backends.sqlite import SQLiteBackend

        return SQLiteBackend(sqlite_path(url))
    raise ConfigurationError(
        f"unsupported store URL scheme {scheme!r} in {url!r}; this version supports sqlite:///"
    )
