"""Row shapes of the incidents pages: the lines of the accounting CSV (Table A49).

Pure (no Django), like the other ``rows`` modules: a frozen dataclass naming the columns of
its table and CSV (``TABLE``). GPU-hours stay ``Decimal`` (exact sums, written as such).
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import ClassVar


@dataclass(frozen=True)
class AccountingLine:
    """One line of the accounting table: a root-cause class, a workload or a total.

    ``table`` is ``class``, ``workload`` or ``total``; ``path`` is ``sandbox`` or
    ``outside`` (for a total: ``sandbox``, ``outside`` or ``all``); ``group`` is the class
    label or the workload (blank for a total).
    """

    table: str
    path: str
    group: str
    gpu_hours_low: Decimal
    gpu_hours_high: Decimal
    cases: int
    TABLE: ClassVar[tuple[str, ...]] = (
        "table",
        "path",
        "group",
        "gpu_hours_low",
        "gpu_hours_high",
        "cases",
    )
