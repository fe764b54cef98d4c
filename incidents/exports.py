"""Export shapes: the JSON document (import's input) and the CSV the admin action writes.

Both read from ``incidents.selectors.export_queryset`` (or any prefetched queryset) and
write the wire shape of ``incidents.records``, so a JSON export always imports again.
The CSV goes through the service's one writer (``sandman_site.csvfile``), which quotes
cells a spreadsheet would run as a formula.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from incidents.models import Incident
from incidents.records import EXPORT_FORMAT, EXPORT_VERSION, IncidentRecordSerializer
from sandman_site.csvfile import csv_text

CSV_COLUMNS = (
    "id",
    "uid",
    "title",
    "started_at",
    "ended_at",
    "stage",
    "what_happened",
    "how_found",
    "cause",
    "root_cause_class",
    "trigger",
    "fix",
    "how_verified",
    "evidence_kind",
    "effect",
    "gpu_hours_low",
    "gpu_hours_high",
    "gpu_hours_basis",
    "workload",
    "status",
    "jobs",
    "sandboxes",
    "recorded_by",
    "recorded_at",
)


def export_document(incidents: Iterable[Incident], *, now: datetime) -> dict[str, Any]:
    return {
        "format": EXPORT_FORMAT,
        "version": EXPORT_VERSION,
        "exported_at": now.isoformat(),
        "incidents": IncidentRecordSerializer(list(incidents), many=True).data,
    }


def _cell(value: Any) -> Any:
    if isinstance(value, list):
        return " ".join(str(v) for v in value)
    return value


def incidents_csv(incidents: Iterable[Incident]) -> str:
    records = IncidentRecordSerializer(list(incidents), many=True).data
    rows = ([_cell(record[column]) for column in CSV_COLUMNS] for record in records)
    return csv_text(CSV_COLUMNS, rows, lineterminator="\r\n")
