"""The Django application config of jobguard: ``manage.py migrate`` also migrates the store."""

from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.db.models.signals import post_migrate


class JobguardConfig(AppConfig):
    """``jobguard.contrib.django`` in ``INSTALLED_APPS``."""

    name = "jobguard.contrib.django"
    label = "jobguard"
    verbose_name = "jobguard"

    def ready(self) -> None:
        """After each ``manage.py migrate``, bring jobguard's schema to this version too."""
        post_migrate.connect(migrate_store_after_django, sender=self)


def migrate_store_after_django(using: str = "default", **_: Any) -> None:
    """Run jobguard's own migrations on the store (the same ones ``jobguard migrate`` runs, so
    either command leaves one schema) when Django migrated the store's alias
    (``JOBGUARD["DATABASE"]``)."""
    from jobguard.backends import migrate_store
    from jobguard.contrib.django.store import store_alias, store_url

    if using == store_alias():
        migrate_store(store_url())
