"""What the demo shows on a terminal: a live progress panel while it runs, then the report."""

from __future__ import annotations

from types import TracebackType
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.panel import Panel
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from jobguard.demo.report import LAYERS


class LiveProgress:
    """A panel redrawn a few times a second from the numbers the runner reads from the store."""

    def __init__(self, console: Console, title: str, orders: int) -> None:
        self._orders = orders
        self._title = title
        self._live = Live(self._render({}), console=console, refresh_per_second=4, transient=True)

    def __enter__(self) -> LiveProgress:
        self._live.__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._live.__exit__(exc_type, exc, tb)

    def update(self, stats: dict[str, Any]) -> None:
        """Redraw with fresh numbers."""
        self._live.update(self._render(stats))

    def _render(self, stats: dict[str, Any]) -> Panel:
        settled = int(stats.get("orders_settled", 0))
        bar = ProgressBar(total=self._orders, completed=settled, width=50)
        line = Text(f" {settled}/{self._orders} orders settled   {stats.get('elapsed_s', 0):.1f}s")
        table = Table.grid(padding=(0, 2))
        table.add_row(
            f"jobs queued {stats.get('queued', 0)}",
            f"running {stats.get('running', 0)}",
            f"completed {stats.get('completed', 0)}",
            f"dead {stats.get('dead', 0)}",
        )
        table.add_row(
            f"workers killed {stats.get('workers_killed', 0)}",
            f"frozen {stats.get('workers_frozen', 0)}",
            f"invoices {stats.get('invoices', 0)}",
            "",
        )
        table.add_row(
            f"dedup hits {stats.get('dedup_hits', 0)}",
            f"memoised steps {stats.get('memoised_steps', 0)}",
            f"retries {stats.get('retries', 0)}",
            f"deferrals {stats.get('deferrals', 0)}",
        )
        table.add_row(
            f"already processed {stats.get('already_processed', 0)}",
            f"stale refused {stats.get('stale', 0)}",
            "",
            "",
        )
        return Panel(Group(Group(bar, line), table), title=self._title, border_style="cyan")


def _counts_table(rows: list[tuple[str, str, str]]) -> Table:
    table = Table.grid(padding=(0, 2))
    table.add_column(min_width=24)
    table.add_column(justify="right", min_width=5)
    table.add_column(style="dim")
    for row in rows:
        table.add_row(*row)
    return table


def render_report(report: dict[str, Any], console: Console) -> None:
    """Print the report for people (``--json`` prints the same data as JSON)."""
    safe = report["mode"] == "safe"
    heading = "every protection on" if safe else "protections OFF (--unsafe)"
    console.print(f"[bold]jobguard demo: order fulfilment under fire[/] ({heading})")
    console.print(
        f"seed {report['seed']} · {report['orders']} orders · {report['workers']} worker "
        f"processes · {report['wall_time_s']:.1f}s · database {escape(report['files']['db'])}"
    )
    shop = report["shop"]
    dup = report["duplicates"]
    console.print("\n[bold]The shop[/]")
    console.print(
        _counts_table(
            [
                ("orders", str(shop["orders"]), ""),
                ("fulfilled", str(shop["fulfilled"]), "stock cut, invoiced, email sent"),
                ("in the dead letter queue", str(shop["in_dlq"]), "see below"),
                ("invoices", str(shop["invoices"]), ""),
                ("stock cut", str(shop["stock_cuts"]), f"{shop['stock_units_cut']} units"),
                (
                    "emails sent",
                    str(shop["emails_sent"]),
                    f"of {shop['mail_requests']} mail API requests",
                ),
            ]
        )
    )
    style = "green" if dup["total"] == 0 else "bold red"
    console.print(
        f"\n[{style}]duplicates: {dup['total']}[/]  (invoices {dup['invoices']}, stock cuts "
        f"{dup['stock_cuts']}, emails {dup['emails']})"
    )
    lost_style = "green" if report["lost"] == 0 else "bold red"
    console.print(
        f"[{lost_style}]lost: {report['lost']}[/]  (orders neither fulfilled nor in the DLQ)"
    )
    _render_faults(report, console)
    if safe:
        _render_layers(report, console)
    else:
        _render_symptoms(report, console)
    if report["dlq"]:
        _render_dlq(report["dlq"], console)
    console.print("\n[bold]Invariants[/]")
    for item in report["invariants"]:
        mark = "[green]✓[/]" if item["ok"] else "[red]✗[/]"
        console.print(f"  {mark} {item['name']}: {escape(item['detail'])}")
    _render_verdict(report, console)


def _render_dlq(dlq: list[dict[str, Any]], console: Console, limit: int = 12) -> None:
    by_order: dict[int, list[dict[str, Any]]] = {}
    for entry in dlq:
        by_order.setdefault(entry["order_id"], []).append(entry)
    console.print(f"\n[bold]Dead letter queue[/] ({len(dlq)} jobs, {len(by_order)} orders)")
    for order_id, entries in list(by_order.items())[:limit]:
        jobs = ", ".join(str(entry["job_id"]) for entry in entries)
        reason = escape(str(entries[-1]["reason"]))
        console.print(f"  order {order_id} (job {jobs}): {reason}")
    if len(by_order) > limit:
        console.print(f"  ... and {len(by_order) - limit} more orders")


def _render_faults(report: dict[str, Any], console: Console) -> None:
    seen = report["faults"]["observed"]
    mail = seen["mail_faults"]
    safe = report["mode"] == "safe"
    console.print("\n[bold]What was thrown at it[/]")
    console.print(
        _counts_table(
            [
                (
                    "webhook deliveries",
                    str(seen["webhook_deliveries"]),
                    f"for {report['orders']} orders: redeliveries, clicks",
                ),
                (
                    "workers SIGKILLed",
                    str(seen["workers_killed"]),
                    "after an effect, before the ack",
                ),
                (
                    "workers frozen (SIGSTOP)",
                    str(seen["workers_frozen"]),
                    "past their lock TTL" if safe else "past their lease",
                ),
                (
                    "slow jobs",
                    str(report["faults"]["planned"]["slow_jobs"]),
                    "longer than lease and lock TTL" if safe else "longer than their lease",
                ),
                (
                    "back-office lock holds",
                    str(seen["back_office_holds"]),
                    "an agent editing the order" if safe else "none: --unsafe takes no locks",
                ),
                (
                    "late redeliveries",
                    str(seen["late_redeliveries"]),
                    "webhook again after fulfilment",
                ),
                (
                    "mail API faults",
                    str(sum(mail.values())),
                    f"{mail['error']} x 503, {mail['timeout']} timeouts, {mail['drop']} drops",
                ),
                ("poison orders", str(seen["poison_orders"]), "invalid data"),
            ]
        )
    )


def _render_layers(report: dict[str, Any], console: Console) -> None:
    console.print("\n[bold]What each layer caught[/]")
    rows = []
    for layer in LAYERS:
        entry = report["layers"][layer.key]
        rows.append((layer.label, str(entry["count"]), f"{layer.requirement:<10} {layer.caught}"))
    console.print(_counts_table(rows))


def _render_symptoms(report: dict[str, Any], console: Console) -> None:
    console.print("\n[bold]The article's symptoms[/]")
    for item in report["symptoms"]:
        style = "bold red" if item["count"] else "green"
        extra = ""
        if "from_duplicate_jobs" in item:
            extra = (
                f" ({item['from_duplicate_jobs']} from duplicate triggers, "
                f"{item['from_redeliveries']} from redeliveries)"
            )
        elif "ambiguous_sends" in item:
            extra = f" ({item['ambiguous_sends']} sends whose answer was lost)"
        console.print(f"  [{style}]{item['symptom']}: {item['count']}[/]{extra}")
        console.print(f"    [dim]would have been caught by {item['caught_by']}[/]")


def _render_verdict(report: dict[str, Any], console: Console) -> None:
    code = report["exit_code"]
    if report["ok"]:
        console.print(f"\n[bold green]OK: zero duplicates, nothing lost[/] (exit code {code})")
    elif report["mode"] == "unsafe":
        console.print(
            f"\n[bold red]BROKEN, as expected with the protections off[/] (exit code {code}). "
            "Run without --unsafe to see the same workload kept correct."
        )
    else:
        console.print(f"\n[bold red]FAILED: an invariant does not hold[/] (exit code {code})")
