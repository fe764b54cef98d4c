"""The incidents app: operations case records, GPU-hour accounting, detectors."""

from __future__ import annotations

from django.apps import AppConfig


class IncidentsConfig(AppConfig):
    name = "incidents"
    default_auto_field = "django.db.models.BigAutoField"
