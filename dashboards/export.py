"""The one JSON/CSV helper of the operator pages: rows to cells, JSON answers, CSV downloads.

Every table or chart export goes through here (each live chart's ``.json`` and ``.csv``,
the accounting CSV) and so does every JSON error of the pages, so they all write cells the
same way: datetimes ISO 8601 UTC with ``Z``, floats rounded to 3 decimals, ``Decimal``
exact, ``None`` as JSON null and as an empty CSV cell.

Rule a reader must not break: a download is built only from ``columns`` and the
:func:`cells` of rows (never from model instances or by hand), so the CSV and the JSON of
one table always carry the same columns and values.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.http import HttpResponse, JsonResponse

from sandman_site.csvfile import csv_text
from sandman_site.errors import SandmanError


def cell(value: Any) -> Any:
    """One JSON/CSV-ready cell: datetimes as ISO 8601 UTC, floats to 3 decimals."""
    if isinstance(value, dt.datetime):
        return value.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")
    if isinstance(value, float):
        return round(value, 3)
    return value


def cells(rows: Iterable[Any], columns: Sequence[str]) -> list[list[Any]]:
    """Rows (objects with those attributes) as lists of cells in ``columns`` order."""
    return [[cell(getattr(row, name)) for name in columns] for row in rows]


def json_response(payload: dict[str, Any], *, status: int = 200) -> JsonResponse:
    """A JSON answer (datetimes and decimals through Django's encoder)."""
    return JsonResponse(payload, status=status, encoder=DjangoJSONEncoder)


def error_response(exc: SandmanError) -> JsonResponse:
    """The house error shape ``{"error": code, "detail": sentence}`` with the error's status."""
    return json_response({"error": exc.code, "detail": exc.message}, status=exc.status)


def csv_response(
    columns: Sequence[str], rows: Iterable[Sequence[Any]], *, filename: str
) -> HttpResponse:
    """A table as a CSV download: a header of ``columns``, then ``rows`` of :func:`cells`
    (written by the service's one CSV writer, which quotes formula-like cells)."""
    response = HttpResponse(csv_text(columns, rows), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response


def stamped_filename(name: str, at: dt.datetime) -> str:
    """``sandman-<name>-<UTC stamp>.csv``: what a live chart's CSV is saved as."""
    return f"sandman-{name}-{at.astimezone(dt.UTC).strftime('%Y%m%dT%H%M%SZ')}.csv"
