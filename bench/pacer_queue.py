#!/usr/bin/env python3
"""Benchmark: CPU to queue a burst of N acquires in one create bucket (``sandboxes/pacing.py``),
this tree beside a baseline commit's ``pacing.py`` in the same run.

A ramp step fires N acquires at once; each one's create asks its job's bucket for a token
(``TokenBucket.acquire``), and all but the first few queue. ``time.process_time()`` from the
first ``acquire()`` until every one of them is queued, for N in ``--sizes``, the two trees
alternating ``--rounds`` times (the bucket refills at 1e-6 tokens/s, so nobody is granted
meanwhile; the callers are then cancelled). Before 2026-12-06 each ``acquire()`` counted
every queued caller (``queue_length``) to ask "is anybody queued?": O(N^2) per burst.

Results: ``bench/results/pacer_queue.json``.
Usage: ``python bench/pacer_queue.py [--baseline REV] [--sizes 1000,4000,12000] [--rounds 3]``
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from types import ModuleType

sys.path.insert(0, str(Path(__file__).resolve().parent))
from module_compare import arguments, compare  # noqa: E402


async def queue_cpu_s(pacing: ModuleType, n: int) -> float:
    bucket = pacing.TokenBucket(1e-6, 1)
    t0 = time.process_time()
    callers = [asyncio.ensure_future(bucket.acquire()) for _ in range(n)]
    while bucket.queue_length < n - 1:  # all but the one that took the banked token
        await asyncio.sleep(0)
    spent = time.process_time() - t0
    for caller in callers:
        caller.cancel()
    await asyncio.gather(*callers, return_exceptions=True)
    bucket.close()
    return spent


def main() -> None:
    args = arguments(__doc__, baseline="822749b", out="pacer_queue.json")
    compare(
        args,
        "sandboxes/pacing.py",
        lambda pacing, n: (asyncio.run(queue_cpu_s(pacing, n)), None),
        benchmark="pacer_queue",
        what="CPU seconds to queue N acquires in one TokenBucket (all but one wait), "
        f"baseline {args.baseline} and this tree alternating, {args.rounds} rounds",
        server="none (in process, one asyncio loop)",
        settings={"bucket": "rate 1e-6/s, burst 1"},
    )


if __name__ == "__main__":
    main()
