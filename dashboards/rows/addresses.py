"""Row shapes of the free-address chart on ``/operations/`` (``sandboxes.addresses``).

Pure (no Django): what ``selectors.addresses`` returns and ``figures.addresses`` draws.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import ClassVar


@dataclass(frozen=True)
class SubnetFreeBucket:
    """The lowest free-address reading of one subnet in one bucket, and the floor then."""

    bucket_start: dt.datetime
    bucket_s: int
    subnet_id: str
    zone: str
    min_available: int
    floor: int
    TABLE: ClassVar[tuple[str, ...]] = (
        "bucket_start",
        "bucket_s",
        "subnet_id",
        "zone",
        "min_available",
        "floor",
    )


@dataclass(frozen=True)
class FloorChangeRow:
    """The pool stopped (``closed``) or resumed creating at ``at`` because of one subnet."""

    at: dt.datetime
    closed: bool
    subnet_id: str
    available: int
    floor: int
