#!/usr/bin/env python3
"""Benchmark: the pool books' CPU for a burst of N acquires of a job with a warm target
(``sandboxes/pool.py``), this tree beside a baseline commit's ``pool.py`` in the same run.

Each acquire of a burst, as the controller does it on its loop (``controller/acquire.py``):
``note_request``, ``admit`` (an ACQUIRE ticket: no warm pod is left), then ``fill_plan`` and
an ``admit`` per planned warm build (``CreateRunner.fill``). The job keeps ``warm_per_key`` = 2
warm pods for its one key; nothing settles during the burst, so ``creating`` grows to N plus
the warm builds. ``time.process_time()`` over the N acquires, for N in ``--sizes``, the two
trees alternating ``--rounds`` times. Before 2026-12-06 ``fill_plan`` counted the warm builds
by walking every ticket in ``creating`` on each acquire: O(N^2) per burst.

Results: ``bench/results/pool_fill.json``.
Usage: ``python bench/pool_fill.py [--baseline REV] [--sizes 1000,4000,12000] [--rounds 3]``
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from types import ModuleType

sys.path.insert(0, str(Path(__file__).resolve().parent))
from module_compare import arguments, compare  # noqa: E402


def burst_cpu_s(pool_mod: ModuleType, n: int) -> tuple[float, int]:
    """CPU seconds for N acquires' pool work; the warm builds the plan started."""
    limits = pool_mod.PoolLimits(max_live=10 * n, max_creating=10 * n, warm_per_key=2)
    pool = pool_mod.JobPool(job_id=1, limits=limits)
    key = pool_mod.PoolKey("img:1", None, 250, 512 * 2**20, None)
    acquire, warm = pool_mod.Purpose.ACQUIRE, pool_mod.Purpose.WARM
    builds = 0
    t0 = time.process_time()
    for _ in range(n):
        pool.note_request(key)
        assert pool.admit(key, purpose=acquire).ticket is not None
        for planned in pool.fill_plan():
            assert pool.admit(planned, purpose=warm).ticket is not None
            builds += 1
    return time.process_time() - t0, builds


def main() -> None:
    args = arguments(__doc__, baseline="d643d19", out="pool_fill.json")
    compare(
        args,
        "sandboxes/pool.py",
        burst_cpu_s,  # both trees must start the same warm builds (same_in_both_trees)
        benchmark="pool_fill",
        what="CPU seconds of the pool books for N acquires of one key (admit, fill_plan, "
        f"the warm builds' admits), warm_per_key 2, baseline {args.baseline} and this tree "
        f"alternating, {args.rounds} rounds",
        server="none (in process)",
        settings={"warm_per_key": 2},
    )


if __name__ == "__main__":
    main()
