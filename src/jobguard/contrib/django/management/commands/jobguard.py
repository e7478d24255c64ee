"""``manage.py jobguard ...``: jobguard's CLI on the project's store and App.

Every command and option of ``jobguard`` (``worker``, ``scheduler``, ``doctor``, ``dlq``,
``migrate``...) is passed through; ``--app`` defaults to ``JOBGUARD["APP"]`` and ``--url`` to
the project's store (:func:`jobguard.contrib.django.store_url`).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser

from jobguard.contrib.django.store import store_url


class Command(BaseCommand):
    """jobguard's CLI with the project's settings."""

    help = "jobguard's command line (worker, scheduler, doctor, dlq, migrate...) on this project"

    def add_arguments(self, parser: CommandParser) -> None:
        """Everything after ``jobguard`` goes to jobguard's CLI as it is."""
        parser.add_argument("args", nargs="*")

    def run_from_argv(self, argv: list[str]) -> None:
        """Hand the arguments to jobguard's CLI untouched (its own options and help)."""
        from django import setup

        setup()
        self.handle(*argv[2:])

    def handle(self, *args: Any, **options: Any) -> None:
        """Run jobguard's CLI; its exit code becomes the command's."""
        from jobguard.cli.main import cli

        configured = getattr(settings, "JOBGUARD", {})
        if _runs_django_tasks(settings):
            from jobguard.contrib.django.tasks import project_app

            project_app()  # the App's workers then run the project's @task functions too
        prefix = ["--url", store_url()]
        if configured.get("APP") and "--app" not in args:
            prefix = ["--app", str(configured["APP"])]
        cli.main(args=[*prefix, *args], prog_name="manage.py jobguard", standalone_mode=True)


def _runs_django_tasks(settings: Any) -> bool:
    backend = "jobguard.contrib.django.tasks.JobguardBackend"
    return any(b.get("BACKEND") == backend for b in getattr(settings, "TASKS", {}).values())
