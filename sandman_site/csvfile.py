"""The one CSV writer of the service: operator-page downloads and the admin's incident export.

A CSV leaves the service for a spreadsheet, where a cell that starts with ``=``, ``+``, ``-``,
``@``, a tab or a carriage return runs as a formula (CSV injection). Job, workload and incident
texts are user input, so every string cell that starts so is written with a leading quote.
Numbers are never quoted (a negative float stays a number); ``None`` is an empty cell.

Rule a reader must not break: every CSV the service writes goes through :func:`csv_text`.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Sequence
from typing import Any

FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def safe_cell(value: Any) -> Any:
    """A cell a spreadsheet shows as written: formula-like strings quoted, None empty."""
    if value is None:
        return ""
    if isinstance(value, str) and value.startswith(FORMULA_START):
        return "'" + value
    return value


def csv_text(
    columns: Sequence[str], rows: Iterable[Sequence[Any]], *, lineterminator: str = "\n"
) -> str:
    """A header of ``columns``, then one line per row of :func:`safe_cell` values."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator=lineterminator)
    writer.writerow(columns)
    writer.writerows([safe_cell(value) for value in row] for row in rows)
    return buffer.getvalue()
