"""Django app config of the operator pages (``dashboards``): no models, templates and views only.

Rule: the app owns no database tables; it reads the other apps' models through its selectors.
"""

from __future__ import annotations

from django.apps import AppConfig


class DashboardsConfig(AppConfig):
    name = "dashboards"
    verbose_name = "Operator dashboards"
