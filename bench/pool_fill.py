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

import argparse
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"


def load(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


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
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", default="d643d19")
    parser.add_argument("--sizes", default="1000,4000,12000")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS / "pool_fill.json")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s]
    old_text = subprocess.run(
        ["git", "show", f"{args.baseline}:sandboxes/pool.py"],
        cwd=ROOT, check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        old_path = Path(tmp) / "pool_baseline.py"
        old_path.write_text(old_text)
        trees = {
            "baseline": load(old_path, "pool_baseline"),
            "this": load(ROOT / "sandboxes" / "pool.py", "pool_this"),
        }
        load0 = os.getloadavg()
        runs: dict[str, dict[int, list[float]]] = {t: {n: [] for n in sizes} for t in trees}
        builds: dict[str, dict[int, int]] = {t: {} for t in trees}
        for _ in range(args.rounds):
            for n in sizes:
                for tag, module in trees.items():
                    spent, started = burst_cpu_s(module, n)
                    runs[tag][n].append(round(spent, 4))
                    builds[tag][n] = started
    assert builds["this"] == builds["baseline"], builds  # the same plan, only faster
    result: dict[str, Any] = {
        "benchmark": "pool_fill",
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "what": "CPU seconds of the pool books for N acquires of one key (admit, fill_plan, "
        f"the warm builds' admits), warm_per_key 2, baseline {args.baseline} and this tree "
        f"alternating, {args.rounds} rounds",
        "server": "none (in process)",
        "settings": {"warm_per_key": 2, "warm_builds_started": builds["this"]},
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "loadavg_before": [round(x, 2) for x in load0],
            "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        },
        "summary": {tag: {str(n): statistics.median(runs[tag][n]) for n in sizes} for tag in trees},
        "runs": {tag: {str(n): v for n, v in by.items()} for tag, by in runs.items()},
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["summary"]))


if __name__ == "__main__":
    main()
