"""Configuration mistakes get one clear error, never a driver traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from jobguard import ConfigurationError
from jobguard.backends.sqlite import SQLiteBackend
from jobguard.cli.main import cli


def test_unknown_synchronous_mode_is_a_configuration_error(tmp_path: Path) -> None:
    """``synchronous=OFF`` would trade durability away silently (G1.2); refuse it."""
    with pytest.raises(ConfigurationError, match="synchronous"):
        SQLiteBackend(str(tmp_path / "jobs.db"), synchronous="OFF")


def test_app_module_with_a_syntax_error_gives_a_one_line_usage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--app`` pointing at broken code: exit 2 with file and line, no traceback."""
    (tmp_path / "brokenjobs.py").write_text("def oops(:\n    pass\n")
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, ["--app", "brokenjobs:app", "worker", "--burst"])
    assert result.exit_code == 2
    assert "syntax error" in result.output
    assert "brokenjobs.py:1" in result.output
    assert "Traceback" not in result.output
