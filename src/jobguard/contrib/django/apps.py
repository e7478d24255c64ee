"""The Django application config of jobguard."""

from __future__ import annotations

from django.apps import AppConfig


class JobguardConfig(AppConfig):
    """``jobguard.contrib.django`` in ``INSTALLED_APPS``."""

    name = "jobguard.contrib.django"
    label = "jobguard"
    verbose_name = "jobguard"
