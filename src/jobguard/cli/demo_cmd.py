"""``jobguard demo``: the article's order fulfilment under fire, then the proof.

Exit codes: 0 when every invariant holds (no double invoice, stock cut or email, nothing lost,
poison orders in the DLQ); 1 when one does not. ``--unsafe`` switches the protections off on
purpose, so it is expected to exit 1: the exit code always says whether the shop stayed correct.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import click
from rich.console import Console

from jobguard.cli.jobs_cmd import emit_json
from jobguard.demo import report as demo_report
from jobguard.demo.display import LiveProgress, render_report
from jobguard.demo.runner import run_demo
from jobguard.demo.settings import DemoFiles, DemoSettings

EXIT_USAGE = 2


@click.command()
@click.option(
    "--orders",
    default=300,
    show_default=True,
    type=click.IntRange(1, 100_000),
    help="How many orders the shop receives.",
)
@click.option(
    "--workers",
    default=4,
    show_default=True,
    type=click.IntRange(1, 64),
    help="Worker processes (each runs 4 handler threads).",
)
@click.option(
    "--seed",
    default=7,
    show_default=True,
    type=int,
    help="Decides every fault; the same seed replays the same faults.",
)
@click.option(
    "--unsafe",
    is_flag=True,
    help="Switch the protections off and watch the shop break (exits 1, as expected).",
)
@click.option(
    "--db",
    "db_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Database file to create (default: shop.db in a new temporary directory). "
    "The mail log is written beside it.",
)
@click.option(
    "--json", "as_json", is_flag=True, help="Print the report as JSON, no progress display."
)
@click.option(
    "--timeout-s",
    default=120.0,
    show_default=True,
    type=click.FloatRange(1, 86_400),
    help="Give up (and report what is unfinished as lost) after this long.",
)
def demo(
    orders: int,
    workers: int,
    seed: int,
    unsafe: bool,
    db_path: Path | None,
    as_json: bool,
    timeout_s: float,
) -> None:
    """Run an online shop's order fulfilment while workers crash, stall and run twice.

    Every order is paid for once, but its webhook fires 1-3 times; workers are SIGKILLed right
    after an effect and before the ack, frozen past their lock, or slower than their lease; the
    mail API answers 503, times out or drops the answer after sending; a few orders carry invalid
    data. The report, computed from the database and the mail service's log, shows that no
    invoice, stock cut or email happened twice, that nothing was lost, and what each layer caught.
    Exit code 0 when every invariant holds, 1 otherwise (--unsafe: 1, as expected).
    """
    if db_path is None:
        db_path = Path(tempfile.mkdtemp(prefix="jobguard-demo-")) / "shop.db"
    elif db_path.exists():
        click.echo(f"error: {db_path} exists; the demo needs a new file", err=True)
        sys.exit(EXIT_USAGE)
    else:
        db_path.parent.mkdir(parents=True, exist_ok=True)
    files = DemoFiles.beside(db_path.resolve())
    err = Console(stderr=True, highlight=False)
    mode = "--unsafe: protections off" if unsafe else "every protection on"
    err.print(f"jobguard demo ({mode}): shop and job store in {files.db}", markup=False)
    settings = DemoSettings(
        db_path=str(files.db), mail_url="", orders=orders, workers=workers, seed=seed, unsafe=unsafe
    )
    show_progress = not as_json and err.is_terminal
    if show_progress:
        title = f"order fulfilment under fire, seed {seed}, {workers} workers"
        with LiveProgress(err, title, orders) as live:
            result = run_demo(settings, files, timeout_s=timeout_s, progress=live.update)
    else:
        result = run_demo(settings, files, timeout_s=timeout_s)
    data = demo_report.build(files, result.info)
    if as_json:
        emit_json(data)
    else:
        out = Console(highlight=False)
        if not out.is_terminal:
            out = Console(highlight=False, width=100)  # a file or pipe: no row wraps
        render_report(data, out)
    sys.exit(data["exit_code"])
