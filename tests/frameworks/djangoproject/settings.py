"""A small Django project: its database is the store (SQLite file or PostgreSQL, from env)."""

import os

SECRET_KEY = "tests-only"
INSTALLED_APPS = ["django.contrib.contenttypes", "jobguard.contrib.django", "shop"]
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"
_pg = os.environ.get("SHOP_PG_DATABASE")
if _pg:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": _pg,
            "USER": "postgres",
            "HOST": "127.0.0.1",
            "PORT": "5432",
        }
    }
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": os.environ["SHOP_SQLITE_FILE"],
            "OPTIONS": {"transaction_mode": "IMMEDIATE"},
        }
    }
JOBGUARD = {"APP": "shop.jobs:app"}
# Django's tasks framework (the django_tasks backport on this Django) on jobguard.
TASKS = {"default": {"BACKEND": "jobguard.contrib.django.tasks.JobguardBackend"}}
