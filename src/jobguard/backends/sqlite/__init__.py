"""The embedded SQLite backend (default)."""

from jobguard.backends.sqlite.backend import SQLiteBackend

__all__ = ["SQLiteBackend"]
