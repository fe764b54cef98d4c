"""The sandboxes app: jobs, sandboxes, acquisitions, the pool and the controller."""

from __future__ import annotations

from django.apps import AppConfig


class SandboxesConfig(AppConfig):
    name = "sandboxes"
    default_auto_field = "django.db.models.BigAutoField"
