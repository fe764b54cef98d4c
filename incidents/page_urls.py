"""Operator pages of the incidents app, mounted under ``/incidents/``."""

from __future__ import annotations

from django.urls import path

from incidents import pages

urlpatterns = [
    path("", pages.index_page, name="incidents-index"),
    path("accounting/", pages.accounting_page, name="incidents-accounting"),
    path("accounting/csv/", pages.accounting_csv, name="incidents-accounting-csv"),
]
