"""The ``jobguard`` command: one entry point, subcommands loaded on demand.

Exit codes (also in ``docs/cli.md``):

* 0 — success
* 1 — the command ran and failed (e.g. not found, the demo's invariants did not hold, the
  doctor found overlapping executions or a timeout below a task's longest run)
* 2 — bad usage or arguments (click's convention)
* 3 — the store is unavailable (cannot open, locked past its timeout)
* 4 — an unexpected internal error (a bug in jobguard): one line, no traceback, unless
  ``JOBGUARD_TRACEBACK=1`` is set

Messages are printed with control characters escaped: they may quote stored text.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any, NoReturn

import click

from jobguard.cli.state import CliState
from jobguard.core.text import escape_controls
from jobguard.exceptions import (
    ConfigurationError,
    EnqueueError,
    JobGuardError,
    StoreUnavailableError,
)

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_STORE_UNAVAILABLE = 3
EXIT_INTERNAL = 4
TRACEBACK_ENV = "JOBGUARD_TRACEBACK"

# name -> "module:attribute"; modules are imported only when their command runs.
COMMANDS = {
    "worker": "jobguard.cli.worker_cmd:worker",
    "enqueue": "jobguard.cli.jobs_cmd:enqueue",
    "jobs": "jobguard.cli.jobs_cmd:jobs",
    "attempts": "jobguard.cli.jobs_cmd:attempts",
    "cancel": "jobguard.cli.cancel_cmd:cancel",
    "dlq": "jobguard.cli.dlq_cmd:dlq",
    "demo": "jobguard.cli.demo_cmd:demo",
    "doctor": "jobguard.cli.doctor_cmd:doctor",
    "prune": "jobguard.cli.prune_cmd:prune",
    "migrate": "jobguard.cli.migrate_cmd:migrate",
    "exporter": "jobguard.cli.exporter_cmd:exporter",
    "dashboard": "jobguard.cli.dashboard_cmd:dashboard",
    "scheduler": "jobguard.cli.schedule_cmd:scheduler",
    "schedules": "jobguard.cli.schedule_cmd:schedules",
    "queue": "jobguard.cli.queue_cmd:queue",
    "retry-now": "jobguard.cli.retry_cmd:retry_now",
}

# One-line help per command for ``jobguard --help``, so listing commands imports none of them.
SHORT_HELP = {
    "attempts": "Show the attempt log of a job or an operation (G10.1).",
    "cancel": "Cancel a queued, scheduled or running job.",
    "demo": "Run the order-fulfillment demo under injected faults.",
    "dlq": "Inspect, replay and purge the dead letter queue (G8).",
    "doctor": "Find overlaps, tight timeouts, retry spikes and missing traces (G10.2-G10.5).",
    "dashboard": "Serve the web dashboard (overview, jobs, DLQ, doctor).",
    "enqueue": "Enqueue a job of a registered task.",
    "exporter": "Serve the store's queue gauges to Prometheus.",
    "jobs": "List jobs, newest first.",
    "migrate": "Apply the store's schema migrations (--dry-run shows the SQL).",
    "prune": "Delete old completed jobs and their attempts (retention).",
    "queue": "Pause, resume and list queues.",
    "retry-now": "Run a job waiting on its backoff now.",
    "scheduler": "Enqueue each tick of the periodic tasks as one job.",
    "schedules": "List the periodic tasks, their next fire times and last tick.",
    "worker": "Run a worker process.",
}

# click >= 8.2 signals "no arguments, show the help" with a UsageError subclass; let it through.
_HELP_REQUESTS: tuple[type[click.UsageError], ...] = tuple(
    getattr(click.exceptions, name)
    for name in ("NoArgsIsHelpError",)
    if hasattr(click.exceptions, name)
)


class LazyGroup(click.Group):
    """A group whose subcommands are imported when used, keeping start-up fast."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        """Every command name, sorted."""
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        """Import and return one command."""
        target = COMMANDS.get(cmd_name)
        if target is None:
            return None
        module_name, attribute = target.split(":")
        command: click.Command = getattr(importlib.import_module(module_name), attribute)
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """List the commands from :data:`SHORT_HELP` without importing them."""
        rows = [(name, SHORT_HELP.get(name, "")) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def invoke(self, ctx: click.Context) -> Any:
        """Run the command, turning jobguard errors into one-line messages and exit codes."""
        try:
            return super().invoke(ctx)
        except _HELP_REQUESTS:
            raise
        except click.UsageError as exc:
            # One line instead of click's usage block: the message and where to read more.
            where = exc.ctx.command_path if exc.ctx is not None else "jobguard"
            _fail(f"{exc.format_message()} (see '{where} --help')", EXIT_USAGE)
        except StoreUnavailableError as exc:
            _fail(f"store unavailable: {exc}", EXIT_STORE_UNAVAILABLE)
        except (ConfigurationError, EnqueueError) as exc:
            _fail(str(exc), EXIT_USAGE)
        except JobGuardError as exc:
            _fail(str(exc), EXIT_FAILED)
        except (click.exceptions.Exit, click.Abort):
            raise
        except Exception as exc:
            if os.environ.get(TRACEBACK_ENV) == "1":
                raise
            _fail(
                f"unexpected {type(exc).__name__}: {exc} (a bug in jobguard; set "
                f"{TRACEBACK_ENV}=1 to see where)",
                EXIT_INTERNAL,
            )


def _fail(message: str, code: int) -> NoReturn:
    """Print ``error: message`` (control characters escaped) and exit ``code``.

    A message of several lines (a driver's connection error) keeps its lines, indented under
    the first so they read as part of it.
    """
    shown = escape_controls(message, keep_lines=True).replace("\n", "\n  ")
    click.echo(f"error: {shown}", err=True)
    sys.exit(code)


@click.group(cls=LazyGroup)
@click.option(
    "--app",
    "app_path",
    envvar="JOBGUARD_APP",
    metavar="MODULE:ATTR",
    help="Your App object, e.g. myproject.jobs:app (env JOBGUARD_APP).",
)
@click.option(
    "--url",
    envvar="JOBGUARD_URL",
    metavar="URL",
    help="Store URL when no --app is given (env JOBGUARD_URL; default sqlite:///jobguard.db).",
)
@click.version_option(package_name="jobguard")
@click.pass_context
def cli(ctx: click.Context, app_path: str | None, url: str | None) -> None:
    """jobguard: background jobs whose side effects happen once."""
    state = CliState(app_path=app_path, url=url)
    ctx.obj = state
    ctx.call_on_close(state.close)


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="jobguard")


if __name__ == "__main__":
    main()
