"""``jobguard dashboard``: serve the web dashboard until SIGTERM or SIGINT."""

from __future__ import annotations

import socket

import click

from jobguard.cli.signals import stop_on_signals
from jobguard.cli.state import CliState
from jobguard.exceptions import ConfigurationError


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind to.")
@click.option(
    "--port",
    default=8642,
    show_default=True,
    type=click.IntRange(0, 65535),
    help="Port to serve on (0 picks a free port).",
)
@click.option(
    "--token",
    envvar="JOBGUARD_DASHBOARD_TOKEN",
    default=None,
    help="Require this token to log in (env JOBGUARD_DASHBOARD_TOKEN).",
)
@click.option("--user", default=None, help="Require this user name and --password to log in.")
@click.option(
    "--password",
    envvar="JOBGUARD_DASHBOARD_PASSWORD",
    default=None,
    help="The password of --user (env JOBGUARD_DASHBOARD_PASSWORD).",
)
@click.option(
    "--allowed-host",
    "allowed_hosts",
    multiple=True,
    metavar="NAME",
    help="Answer requests for this host name too (repeatable; '*' for any). Without a login, "
    "only localhost and loopback addresses are answered by default.",
)
@click.pass_obj
def dashboard(
    state: CliState,
    host: str,
    port: int,
    token: str | None,
    user: str | None,
    password: str | None,
    allowed_hosts: tuple[str, ...],
) -> None:
    """Serve the dashboard: queues, jobs, attempt timelines, the DLQ and the doctor.

    Bound to 127.0.0.1 it needs no login unless --token or --user is given; bound to any other
    address it refuses to start without one. Without a login it answers only requests for
    localhost or a loopback address (DNS rebinding), and the names given with --allowed-host.
    """
    try:
        import uvicorn

        from jobguard.dashboard.security import Access, check_binding
        from jobguard.dashboard.web import create_app
    except ImportError as exc:
        raise ConfigurationError(
            f"the dashboard needs the 'dashboard' extra (pip install 'jobguard[dashboard]'): {exc}"
        ) from exc
    access = Access(token=token, user=user, password=password, allowed_hosts=allowed_hosts or None)
    check_binding(host, access)
    app = state.inspecting_app()
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigurationError(
            f"cannot serve the dashboard on {host}:{port}: {exc.strerror or exc}"
        ) from exc
    sock.listen(128)  # connections wait in the backlog until the server accepts them
    bound_port = sock.getsockname()[1]
    shown = f"[{host}]" if family == socket.AF_INET6 else host
    login = "login required" if access.required else "no login (local only)"
    config = uvicorn.Config(create_app(app, access), log_level="warning", access_log=False)
    server = uvicorn.Server(config)

    def stop() -> None:
        server.should_exit = True

    # Ours until uvicorn installs its own (a signal may come before), and after: uvicorn
    # raises the signals it caught again once it has shut down, for the handlers it found.
    restore = stop_on_signals(stop)
    try:
        click.echo(f"dashboard at http://{shown}:{bound_port}/ ({login})", err=True)
        server.run(sockets=[sock])
    finally:
        sock.close()
        restore()
    click.echo("dashboard stopped", err=True)
