"""Wait for the host to go quiet before a measured run: the run before it (its sandboxes'
teardown, their cgroups, the kernel's deferred work) must not be measured as this one's.

Alternating benches (``acquire_compare.py``, ``cpu_per_create.py``) start each run as soon
as the one before returned. Their recorded loads at the starts were 13-29 on 2 cores, so
whether the one before was still tearing down hundreds of local sandboxes was a fair
question. Its first use answered it: every run of ``acquire_compare_health_probe_quiet.json``
found the host under 0.1 busy cores in its first 2 s window, so those load averages are the
earlier minute's bursts (a lagging figure), not work left running; the same tree's pairs/s
still ranged 383-442 there. The check stays as a guard, and each run records what it saw.
"""

from __future__ import annotations

import os
import time
from typing import Any

from acquire_latency import host_busy_s  # the same /proc/stat reading the benches record


def settle(
    *, busy_cores_below: float = 0.15, window_s: float = 2.0, max_s: float = 180.0
) -> dict[str, Any]:
    """Return once the host's busy CPU over ``window_s`` is below ``busy_cores_below`` cores,
    or after ``max_s``; what was seen, for the run's record."""
    start = time.monotonic()
    while True:
        before = host_busy_s()
        time.sleep(window_s)  # a measurement window, not a synchronisation
        busy = (host_busy_s() - before) / window_s
        waited = time.monotonic() - start
        if busy < busy_cores_below or waited >= max_s:
            return {
                "settled": busy < busy_cores_below,
                "waited_s": round(waited, 1),
                "busy_cores_last_window": round(busy, 3),
                "busy_cores_below": busy_cores_below,
                "load_average": [round(x, 2) for x in os.getloadavg()],
            }
