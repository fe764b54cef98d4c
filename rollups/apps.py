"""Django app config of the rollup tables (``rollups``): derived data, refreshed by a job."""

from __future__ import annotations

from django.apps import AppConfig


class RollupsConfig(AppConfig):
    name = "rollups"
    verbose_name = "Dashboard rollups"
    default_auto_field = "django.db.models.BigAutoField"
