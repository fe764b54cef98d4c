"""The grading app: tasks, task-set certification, run conditions, gradings."""

from __future__ import annotations

from django.apps import AppConfig


class GradingConfig(AppConfig):
    name = "grading"
    default_auto_field = "django.db.models.BigAutoField"
