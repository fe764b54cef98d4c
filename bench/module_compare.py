"""Shared by the in-process benches that time one module of this tree beside the same
module at a baseline commit (``pacer_queue.py``, ``pool_fill.py``): the baseline's file is
taken with ``git show`` and loaded beside this tree's under another name, the two are
measured alternately for each size, ``rounds`` times, so both see the same machine load,
and the result is written as one JSON document with the load average around the runs.
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
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"

# One measurement: (CPU seconds, what the run did that both trees must agree on, or None).
Measure = Callable[[ModuleType, int], tuple[float, Any]]


def load(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


def arguments(doc: str, *, baseline: str, out: str) -> argparse.Namespace:
    """``--baseline``, ``--sizes``, ``--rounds``, ``--out``."""
    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    parser.add_argument("--baseline", default=baseline)
    parser.add_argument("--sizes", default="1000,4000,12000")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS / out)
    return parser.parse_args()


def compare(
    args: argparse.Namespace, module: str, measure: Measure, *, benchmark: str, **described: Any
) -> dict[str, Any]:
    """Measure ``module`` (a path under the repository) at ``args.baseline`` and in this
    tree, alternating; write and return the JSON document. Each run's second value must be
    the same in both trees (the same work, only faster). ``described``: the document's
    ``what``, ``server`` and ``settings``."""
    sizes = [int(s) for s in args.sizes.split(",") if s]
    stem = Path(module).stem
    old_text = subprocess.run(
        ["git", "show", f"{args.baseline}:{module}"],
        cwd=ROOT, check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    runs: dict[str, dict[int, list[float]]] = {t: {n: [] for n in sizes} for t in TREES}
    did: dict[str, dict[int, Any]] = {t: {} for t in TREES}
    with tempfile.TemporaryDirectory() as tmp:
        old_path = Path(tmp) / f"{stem}_baseline.py"
        old_path.write_text(old_text)
        trees = {
            "baseline": load(old_path, f"{stem}_baseline"),
            "this": load(ROOT / module, f"{stem}_this"),
        }
        load0 = os.getloadavg()
        for _ in range(args.rounds):
            for n in sizes:
                for tag, loaded in trees.items():
                    spent, done = measure(loaded, n)
                    runs[tag][n].append(round(spent, 4))
                    did[tag][n] = done
    assert did["this"] == did["baseline"], did  # the same work in both trees
    result: dict[str, Any] = {
        "benchmark": benchmark,
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **described,
        "baseline": args.baseline,
        "rounds": args.rounds,
        # What each run did that both trees agreed on, by size (None: nothing to compare).
        "same_in_both_trees": {str(n): done for n, done in did["this"].items()},
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "loadavg_before": [round(x, 2) for x in load0],
            "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        },
        "summary": {tag: {str(n): statistics.median(runs[tag][n]) for n in sizes} for tag in TREES},
        "runs": {tag: {str(n): v for n, v in by.items()} for tag, by in runs.items()},
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["summary"]))
    return result


TREES = ("baseline", "this")
