"""REST routes of the incidents app, mounted under ``/api/v1/``."""

from __future__ import annotations

from django.urls import path

from incidents import apis

urlpatterns = [
    path("incidents/", apis.IncidentCollectionApi.as_view(), name="incidents-collection"),
    path("incidents/accounting/", apis.AccountingApi.as_view(), name="incidents-accounting-api"),
    path("incidents/export/", apis.ExportApi.as_view(), name="incidents-export"),
    path("incidents/import/", apis.ImportApi.as_view(), name="incidents-import"),
    path("incidents/<int:incident_id>/", apis.IncidentDetailApi.as_view(), name="incidents-detail"),
]
