"""What every subcommand shares: how to find the user's App."""

from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass, field

from jobguard.app import App
from jobguard.exceptions import ConfigurationError


def load_app(path: str) -> App:
    """Import ``module:attribute`` (the working directory is importable) and return the App."""
    module_name, sep, attribute = path.partition(":")
    if not sep or not module_name or not attribute:
        raise ConfigurationError(f"--app must look like module:attribute, got {path!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(f"cannot import {module_name!r}: {exc}") from exc
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

    def app_with_tasks(self) -> App:
        """The user's App; commands that run or enqueue tasks need their definitions."""
        if not self.app_path:
            raise ConfigurationError("this command needs --app MODULE:ATTR (or JOBGUARD_APP)")
        return self.app()
