"""Reads behind the incidents pages (``/incidents/`` and ``/incidents/accounting/``).

The accounting itself (Table A49: bounds by root-cause class and workload, per path, each
job counted in one case) is ``incidents.selectors.accounting``, shared with the incidents
REST API; this module reads the latest cases for the index and lays the accounting out as
table lines. Rule: a fixed number of queries per page, whatever the number of incidents.
"""

from __future__ import annotations

from dataclasses import dataclass

from dashboards.rows.incidents import AccountingLine
from incidents.models import Incident
from incidents.selectors import Accounting
from incidents.states import IncidentStatus

INDEX_ROWS = 200


@dataclass(frozen=True)
class IncidentIndex:
    """The newest ``latest`` incidents (without links), of ``total``; ``open_drafts`` counts
    the detectors' drafts still open."""

    latest: list[Incident]
    total: int
    open_drafts: int


def incident_index(*, limit: int = INDEX_ROWS) -> IncidentIndex:
    """Newest first (``started_at``, then ``id``); three queries."""
    newest = Incident.objects.order_by("-started_at", "-id")
    return IncidentIndex(
        latest=list(newest[:limit]),
        total=newest.count(),
        open_drafts=newest.filter(status=IncidentStatus.OPEN).exclude(detector_key="").count(),
    )


def accounting_lines(acc: Accounting) -> list[AccountingLine]:
    """The accounting as one long table: class lines, workload lines, then the totals."""
    lines = [
        AccountingLine("class", r.path, r.label, r.bounds.low, r.bounds.high, r.bounds.cases)
        for r in acc.by_class
    ]
    lines.extend(
        AccountingLine("workload", r.path, r.workload, r.bounds.low, r.bounds.high, r.bounds.cases)
        for r in acc.by_workload
    )
    lines.extend(
        AccountingLine("total", key, "", b.low, b.high, b.cases) for key, b in acc.totals.items()
    )
    return lines
