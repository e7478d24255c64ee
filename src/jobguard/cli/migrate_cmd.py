"""``jobguard migrate``: bring the store's schema to the version this jobguard knows."""

from __future__ import annotations

import click

from jobguard.cli.state import CliState


@click.command()
@click.option("--dry-run", is_flag=True, help="Print the SQL that would run; change nothing.")
@click.pass_obj
def migrate(state: CliState, dry_run: bool) -> None:
    """Apply the schema migrations the store lacks (forward only, one transaction).

    PostgreSQL stores need this before their first worker starts, and after an upgrade of
    jobguard that brings a migration; SQLite files migrate themselves when opened.
    """
    app = state.app_without_store()
    version, statements = app.migrate(dry_run=dry_run)
    if dry_run:
        for sql in statements:
            click.echo(sql.rstrip())
        verb = "would apply" if statements else "nothing to apply"
        click.echo(
            f"-- schema version {version}; {verb} {len(statements) or ''}".rstrip(), err=True
        )
        return
    if statements:
        click.echo(f"migrated to schema version {version} ({len(statements)} applied)")
    else:
        click.echo(f"already at schema version {version}")
