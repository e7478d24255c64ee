"""What every subcommand shares: how to find the user's App."""

from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass, field

from jobguard.app import App
from jobguard.backends import DEFAULT_URL, sqlite_path
from jobguard.exceptions import ConfigurationError, StoreUnavailableError


def load_app(path: str) -> App:
    """Import ``module:attribute`` (the working directory is importable) and return the App."""
    module_name, sep, attribute = path.partition(":")
    if not sep or not module_name or not attribute:
        raise ConfigurationError(f"--app must look like module:attribute, got {path!r}")
    if not all(part.isidentifier() for part in module_name.split(".")):
        raise ConfigurationError(
            f"--app names module {module_name!r}, which is not an absolute module name like "
            "myproject.jobs (no leading dots, slashes or file names: run jobguard from the "
            "directory the module is imported from)"
        )
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(f"cannot import {module_name!r}: {exc}") from exc
    except SyntaxError as exc:
        raise ConfigurationError(
            f"cannot import {module_name!r}: syntax error at {exc.filename}:{exc.lineno}: {exc.msg}"
        ) from exc
    except Exception as exc:
        # The module's own code failed (a missing environment variable, a setting): the user's
        # mistake to fix, not jobguard's, so usage (exit 2) with what it raised.
        raise ConfigurationError(
            f"cannot import {module_name!r}: it raised {type(exc).__name__}: {exc}"
        ) from exc
    app = getattr(module, attribute, None)
    if not isinstance(app, App):
        raise ConfigurationError(f"{path!r} is not a jobguard App (got {type(app).__name__})")
    return app


@dataclass
class CliState:
    """Options of the top-level command, resolved lazily."""

    app_path: str | None
    url: str | None
    _app: App | None = field(default=None, repr=False)

    def app(self) -> App:
        """The user's App (from --app) or a bare App on --url for inspection commands."""
        if self._app is None:
            self._app = load_app(self.app_path) if self.app_path else App(self.url)
        return self._app

    def app_without_store(self) -> App:
        """The App (from --app, else a bare one on --url), its store not opened yet."""
        return self.app()

    def inspecting_app(self) -> App:
        """The app for read-mostly commands (jobs, attempts, dlq).

        Without --app the store named by --url must already exist: inspecting a path with a
        typo should say so, not create an empty database and report that it holds no jobs.
        """
        if self._app is None and not self.app_path:
            url = self.url or DEFAULT_URL
            if url.startswith("sqlite:"):
                path = sqlite_path(url)
                if not os.path.exists(path):
                    raise StoreUnavailableError(f"no SQLite database at {path!r} (from {url})")
        return self.app()

    def close(self) -> None:
        """Close the store's connections if an app was opened."""
        if self._app is not None:
            self._app.close()

    def app_with_tasks(self) -> App:
        """The user's App; commands that run or enqueue tasks need their definitions."""
        if not self.app_path:
            raise ConfigurationError("this command needs --app MODULE:ATTR (or JOBGUARD_APP)")
        return self.app()
