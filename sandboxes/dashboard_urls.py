"""Operator pages of this app, mounted at the site root: the live dashboard and its data."""

from __future__ import annotations

from django.urls import path

from sandboxes import pages

urlpatterns = [
    path("", pages.dashboard, name="dashboard"),
    path("favicon.ico", pages.favicon, name="favicon"),
    path("dashboard/data/<slug:chart>.json", pages.chart_json, name="dashboard-chart-json"),
    path("dashboard/data/<slug:chart>.csv", pages.chart_csv, name="dashboard-chart-csv"),
]
