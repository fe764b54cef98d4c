"""Export shapes: the JSON document (import's input) and the CSV the admin action writes.

Both read from ``incidents.selectors.export_queryset`` (or any prefetched queryset) and
write the wire shape of ``incidents.records``, so a JSON export always imports again.
CSV cells that a spreadsheet would run as a formula are prefixed with a quote.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from incidents.models import Incident
from incidents.records import EXPORT_FORMAT, EXPORT_VERSION, IncidentRecordSerializer

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
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def export_document(incidents: Iterable[Incident], *, now: datetime) -> dict[str, Any]:
    return {
        "format": EXPORT_FORMAT,
        "version": EXPORT_VERSION,
        "exported_at": now.isoformat(),
        "incidents": IncidentRecordSerializer(list(incidents), many=True).data,
    }


def _cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, list):
        return " ".join(str(v) for v in value)
    if isinstance(value, str) and value.startswith(_FORMULA_START):
        return "'" + value
    return value


def incidents_csv(incidents: Iterable[Incident]) -> str:
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(CSV_COLUMNS)
    for record in IncidentRecordSerializer(list(incidents), many=True).data:
        writer.writerow([_cell(record[column]) for column in CSV_COLUMNS])
    return out.getvalue()
