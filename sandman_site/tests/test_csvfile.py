"""The one CSV writer: formula-like cells are quoted, numbers and None are not mangled."""

from __future__ import annotations

import csv
import io

from sandman_site.csvfile import csv_text, safe_cell


def test_cells_a_spreadsheet_would_run_as_formulas_get_a_leading_quote() -> None:
    for text in ("=1+1", "+cmd", "-2+3", "@SUM(A1)", "\tx", "\rx"):
        assert safe_cell(text) == "'" + text


def test_numbers_plain_text_and_none_are_written_as_they_are() -> None:
    assert safe_cell(-2.5) == -2.5
    assert safe_cell(0) == 0
    assert safe_cell("job-1") == "job-1"
    assert safe_cell(None) == ""


def test_csv_text_has_the_header_then_one_parsable_line_per_row() -> None:
    text = csv_text(("name", "hours"), [("=HYPERLINK(1)", -1.5), ("a,b", None)])
    assert list(csv.reader(io.StringIO(text))) == [
        ["name", "hours"],
        ["'=HYPERLINK(1)", "-1.5"],
        ["a,b", ""],
    ]
    assert text.endswith("\n") and "\r" not in text
    assert csv_text(("a",), [], lineterminator="\r\n") == "a\r\n"
