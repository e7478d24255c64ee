"""Framework packages are optional: importing jobguard (and enqueueing) loads none of them."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

FRAMEWORKS = ("sqlalchemy", "django", "fastapi", "starlette", "httpx", "flask", "aiosqlite")


def test_importing_jobguard_loads_no_framework(tmp_path: Path) -> None:
    code = (
        "import sys, jobguard, jobguard.task, jobguard.testing\n"
        f"app = jobguard.App('sqlite:///{tmp_path / 'jobs.db'}')\n"
        "@app.task\n"
        "def noop(ctx): pass\n"
        "noop.enqueue()\n"
        f"loaded = [m for m in {FRAMEWORKS!r} if m in sys.modules]\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_the_core_install_needs_no_framework() -> None:
    project = tomllib.loads(
        (Path(__file__).parents[2] / "pyproject.toml").read_text(encoding="utf-8")
    )["project"]
    core = " ".join(project["dependencies"]).lower()
    assert not [name for name in FRAMEWORKS if name in core]
    extras = project["optional-dependencies"]
    assert {"sqlalchemy", "django"} <= set(extras)
    assert "fastapi" not in extras  # jobguard imports nothing of FastAPI: no extra of its own
