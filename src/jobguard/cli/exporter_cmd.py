"""``jobguard exporter``: serve the store's queue gauges to Prometheus."""

from __future__ import annotations

import threading

import click

from jobguard.cli.signals import stop_on_signals
from jobguard.cli.state import CliState


@click.command()
@click.option(
    "--port",
    default=9464,
    show_default=True,
    type=click.IntRange(0, 65535),
    help="Serve at http://HOST:PORT/metrics (0 picks a free port).",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind to.")
@click.pass_obj
def exporter(state: CliState, port: int, host: str) -> None:
    """Serve queue depth, jobs in flight, oldest job age and DLQ size per queue until stopped.

    The store is read at every scrape; SIGTERM or SIGINT stops the exporter.
    """
    from jobguard.observability.metrics import serve, store_registry

    app = state.inspecting_app()
    stop = threading.Event()
    restore = stop_on_signals(stop.set)
    try:
        bound_host, bound_port = serve(store_registry(app), port, host)
        click.echo(f"exporter serving http://{bound_host}:{bound_port}/metrics", err=True)
        while not stop.wait(0.5):
            pass
    finally:
        restore()
    click.echo("exporter stopped", err=True)
