"""The store URL of a Django project, and ``db_step`` transactions on Django's connection."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any
from urllib.parse import quote

from jobguard.exceptions import ConfigurationError, StoreUnavailableError
from jobguard.steptx import StepCall

try:
    from django.conf import settings
    from django.db import InterfaceError, OperationalError, connections, transaction
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ConfigurationError(
        "jobguard.contrib.django needs Django: pip install 'jobguard[django]'"
    ) from exc


def store_alias() -> str:
    """The database alias of the store: ``JOBGUARD["DATABASE"]``, default ``"default"``."""
    return str(getattr(settings, "JOBGUARD", {}).get("DATABASE", "default"))


def store_url() -> str:
    """``JOBGUARD["URL"]`` if set, else the URL of the store's database (PostgreSQL, SQLite)."""
    configured = getattr(settings, "JOBGUARD", {}).get("URL")
    if configured:
        return str(configured)
    alias = store_alias()
    database = settings.DATABASES[alias]
    engine = database["ENGINE"]
    if engine == "django.db.backends.sqlite3":
        name = str(database["NAME"])
        if name in ("", ":memory:") or name.startswith("file:"):
            raise ConfigurationError(
                "jobguard needs the SQLite database to be a file; set JOBGUARD['URL'] otherwise"
            )
        return f"sqlite:///{name}"
    if engine == "django.db.backends.postgresql":
        user = quote(str(database.get("USER") or ""), safe="")
        password = quote(str(database.get("PASSWORD") or ""), safe="")
        login = f"{user}:{password}@" if password else (f"{user}@" if user else "")
        host = database.get("HOST") or "localhost"
        port = f":{database['PORT']}" if database.get("PORT") else ""
        return f"postgresql://{login}{host}{port}/{quote(str(database['NAME']), safe='')}"
    raise ConfigurationError(
        f"jobguard's store is PostgreSQL or SQLite; DATABASES[{alias!r}] is {engine}: set "
        "JOBGUARD['URL']"
    )


class DjangoSteps:
    """``db_step`` transactions on Django's connection (pass as ``ctx.db_step(..., on=)``).

    The step function is called with ``None`` first (it writes through the ORM, which uses the
    same connection) and runs inside ``transaction.atomic()``; the step record is written in
    that transaction, so the ORM's writes commit with it or not at all. A ``transaction.atomic()``
    inside the step function is a savepoint and does not end the step's transaction.

    On SQLite, give the database ``"OPTIONS": {"transaction_mode": "IMMEDIATE"}`` (Django 5.1+):
    the step reads the guard and then writes, and a deferred transaction's upgrade fails at
    once when another process wrote in between.

    Args:
        using: The database alias of the store (default :func:`store_alias`).
    """

    def __init__(self, using: str | None = None) -> None:
        self.using = using or store_alias()

    @contextmanager
    def transaction(self) -> Iterator[tuple[Any, StepCall]]:
        """An ``atomic()`` block on the alias's connection (see the protocol).

        Django's own connection failures (connect, begin, commit) are raised as
        :class:`~jobguard.exceptions.StoreUnavailableError`, as the store's own are.
        """
        try:
            with self._atomic() as opened:
                yield opened
        except (OperationalError, InterfaceError) as error:
            raise StoreUnavailableError(f"the db_step transaction failed: {error}") from error

    @contextmanager
    def _atomic(self) -> Iterator[tuple[Any, StepCall]]:
        wrapper = connections[self.using]
        if not wrapper.in_atomic_block:
            # What Django does around each request: a worker's handler thread keeps its
            # connection for many jobs, so one the server dropped is replaced here.
            wrapper.close_if_unusable_or_obsolete()
        with transaction.atomic(using=self.using):
            wrapper.ensure_connection()
            yield wrapper.connection, _call


def _call(fn: Callable[..., Any], args: Sequence[Any]) -> Any:
    return fn(None, *args)
