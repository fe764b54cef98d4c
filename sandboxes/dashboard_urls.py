"""Operator pages of this app, mounted at the site root: the live dashboards and their data."""

from __future__ import annotations

from django.urls import path

from sandboxes import operations_pages, pages

urlpatterns = [
    path("", pages.dashboard, name="dashboard"),
    path("favicon.ico", pages.favicon, name="favicon"),
    path("dashboard/data/<slug:chart>.json", pages.chart_json, name="dashboard-chart-json"),
    path("dashboard/data/<slug:chart>.csv", pages.chart_csv, name="dashboard-chart-csv"),
    path("operations/", operations_pages.operations, name="operations"),
    path(
        "operations/data/<slug:chart>.json",
        operations_pages.chart_json,
        name="operations-chart-json",
    ),
    path(
        "operations/data/<slug:chart>.csv",
        operations_pages.chart_csv,
        name="operations-chart-csv",
    ),
]
