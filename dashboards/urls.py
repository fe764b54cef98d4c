"""Routes of every operator page, mounted at the site root: the live pages, their data, and
the incidents pages (kept under ``/incidents/``, their URL names unchanged).

Rule: every view routed here is wrapped by ``dashboards.access`` (pages redirect anonymous
visitors to the admin login, data endpoints answer JSON); ``dashboards.tests.test_access``
checks each one.
"""

from __future__ import annotations

from django.urls import path

from dashboards.pages import grading, incidents, operations, overview, training

urlpatterns = [
    path("", overview.dashboard, name="dashboard"),
    path("dashboard/data/<slug:chart>.json", overview.chart_json, name="dashboard-chart-json"),
    path("dashboard/data/<slug:chart>.csv", overview.chart_csv, name="dashboard-chart-csv"),
    path("operations/", operations.operations, name="operations"),
    path(
        "operations/data/<slug:chart>.json",
        operations.chart_json,
        name="operations-chart-json",
    ),
    path(
        "operations/data/<slug:chart>.csv",
        operations.chart_csv,
        name="operations-chart-csv",
    ),
    path("training/", training.training, name="training"),
    path("training/data/<slug:chart>.json", training.chart_json, name="training-chart-json"),
    path("training/data/<slug:chart>.csv", training.chart_csv, name="training-chart-csv"),
    path("gradings/", grading.gradings, name="gradings"),
    path("gradings/data/<slug:chart>.json", grading.chart_json, name="gradings-chart-json"),
    path("gradings/data/<slug:chart>.csv", grading.chart_csv, name="gradings-chart-csv"),
    path("incidents/", incidents.index_page, name="incidents-index"),
    path("incidents/accounting/", incidents.accounting_page, name="incidents-accounting"),
    path(
        "incidents/accounting/csv/",
        incidents.accounting_csv,
        name="incidents-accounting-csv",
    ),
]
