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

import argparse
import asyncio
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
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", default="822749b")
    parser.add_argument("--sizes", default="1000,4000,12000")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS / "pacer_queue.json")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s]
    old_text = subprocess.run(
        ["git", "show", f"{args.baseline}:sandboxes/pacing.py"],
        cwd=ROOT, check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        old_path = Path(tmp) / "pacing_baseline.py"
        old_path.write_text(old_text)
        trees = {
            "baseline": load(old_path, "pacing_baseline"),
            "this": load(ROOT / "sandboxes" / "pacing.py", "pacing_this"),
        }
        load0 = os.getloadavg()
        runs: dict[str, dict[int, list[float]]] = {t: {n: [] for n in sizes} for t in trees}
        for _ in range(args.rounds):
            for n in sizes:
                for tag, module in trees.items():
                    runs[tag][n].append(round(asyncio.run(queue_cpu_s(module, n)), 4))
    result: dict[str, Any] = {
        "benchmark": "pacer_queue",
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "what": "CPU seconds to queue N acquires in one TokenBucket (all but one wait), "
        f"baseline {args.baseline} and this tree alternating, {args.rounds} rounds",
        "server": "none (in process, one asyncio loop)",
        "settings": {"bucket": "rate 1e-6/s, burst 1"},
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
