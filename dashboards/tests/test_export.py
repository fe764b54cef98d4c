"""The one JSON/CSV helper: cells written the same way for every table, CSV as a download."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from decimal import Decimal

from dashboards.export import cells, csv_response, stamped_filename


@dataclass(frozen=True)
class Row:
    at: dt.datetime
    rate: float | None
    hours: Decimal


def test_cells_write_utc_times_with_z_rounded_floats_and_exact_decimals() -> None:
    plus_two = dt.timezone(dt.timedelta(hours=2))
    rows = [Row(dt.datetime(2026, 10, 14, 14, 0, 5, tzinfo=plus_two), 1 / 3, Decimal("7124.5"))]
    assert cells(rows, ("at", "rate", "hours")) == [
        ["2026-10-14T12:00:05Z", 0.333, Decimal("7124.5")]
    ]


def test_a_csv_download_has_the_header_and_empty_cells_for_missing_values() -> None:
    at = dt.datetime(2026, 10, 14, 12, 0, tzinfo=dt.UTC)
    rows = cells([Row(at, None, Decimal("3"))], ("at", "rate", "hours"))
    response = csv_response(("at", "rate", "hours"), rows, filename=stamped_filename("x", at))
    assert response["Content-Type"] == "text/csv; charset=utf-8"
    disposition = 'attachment; filename="sandman-x-20261014T120000Z.csv"'
    assert response["Content-Disposition"] == disposition
    assert response.content.decode() == "at,rate,hours\n2026-10-14T12:00:00Z,,3\n"


def test_a_csv_download_quotes_a_job_name_a_spreadsheet_would_run_as_a_formula() -> None:
    """Job and workload names are user text: CSV injection is refused at the one writer."""
    response = csv_response(("job", "hours"), [['=HYPERLINK("x")', -2.0]], filename="t.csv")
    assert response.content.decode() == 'job,hours\n"\'=HYPERLINK(""x"")",-2.0\n'
