"""The README's two commands stay true: CI runs the second verbatim, and a real (non-editable)
install of the package runs the first one's demo."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.procs import clean_env

REPO_ROOT = Path(__file__).resolve().parents[2]


def two_commands() -> list[str]:
    """The shell blocks of the README's "The two commands" section, in order."""
    readme = (REPO_ROOT / "README.md").read_text()
    section = readme.split("## The two commands", 1)[1].split("\n## ", 1)[0]
    return [block.strip() for block in re.findall(r"```sh\n(.*?)```", section, re.DOTALL)]


def test_readme_has_exactly_two_single_line_commands_demo_then_tests() -> None:
    """One pasteable line each: the demo first, the whole test suite second."""
    demo, tests = two_commands()
    for command in (demo, tests):
        assert "\n" not in command
        assert command.startswith("python3 -m venv .venv && ")
    assert demo.endswith("jobguard demo")
    assert tests.endswith("python -m pytest")


def test_ci_runs_the_readmes_test_command_verbatim() -> None:
    """``.ci/run`` must call exactly the test command a newcomer is told to run."""
    _, tests = two_commands()
    ci_lines = (REPO_ROOT / ".ci" / "run").read_text().splitlines()
    assert tests in [line.strip() for line in ci_lines]
    assert "-k " not in tests  # nothing is deselected
    assert "--deselect" not in tests


@pytest.mark.chaos
def test_a_regular_install_ships_everything_the_demo_needs(tmp_path: Path) -> None:
    """Installed as a wheel would be (not from the source tree), the demo still finds its SQL
    files and runs to a clean report: packaging cannot silently drop package data."""
    target = tmp_path / "site"
    # Build from a copy: an in-tree build would leave build/ and egg-info in the checkout.
    source = tmp_path / "source"
    shutil.copytree(
        REPO_ROOT,
        source,
        ignore=shutil.ignore_patterns(
            ".git",
            ".venv",
            "build",
            "*.egg-info",
            "__pycache__",
            ".*_cache",
            ".hypothesis",
            "*.db*",
        ),
    )
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--target",
            str(target),
            str(source),
        ],
        check=True,
        capture_output=True,
        timeout=240,
    )
    env = clean_env()
    env["PYTHONPATH"] = str(target)
    where = subprocess.run(
        [sys.executable, "-c", "import jobguard; print(jobguard.__file__)"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert where.stdout.startswith(str(target)), where.stdout
    demo = subprocess.run(
        [
            sys.executable,
            "-m",
            "jobguard.cli.main",
            "demo",
            "--orders",
            "20",
            "--workers",
            "2",
            "--json",
            "--db",
            str(tmp_path / "shop.db"),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,  # the exit code is asserted below, with stderr in the message
    )
    assert demo.returncode == 0, demo.stderr[-2000:]
    report = json.loads(demo.stdout)
    assert report["duplicates"]["total"] == 0
    assert report["lost"] == 0
    assert report["ok"] is True
