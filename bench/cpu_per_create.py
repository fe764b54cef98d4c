#!/usr/bin/env python3
"""Benchmark: controller CPU per create, this tree beside a baseline commit, in one run.

Runs ``bench/scale_ramp.py --steps N`` (one burst of N acquires against the out-of-process
stand-in, no hold) alternately from a ``git archive`` of ``--baseline`` (default: the
commit before the controller-CPU work, 706f7c6) and from this tree, ``--rounds`` times
each, so both see the same machine load; records every run's
``controller_cpu_ms_per_create`` (``time.process_time()`` of the controller's process over
the burst / creates: its loop, database, Kubernetes-client and informer threads, and the
driver that fires the acquires), the CPU by thread role where the tree records it, Ready
counts, leaks and the load average; beside it, the CPU of the drain that follows per
sandbox (``drain_cpu_ms_per_sandbox``: every delete's write, DELETE and confirmation; not
part of the per-create figure).

Results: ``bench/results/cpu_per_create.json`` (``--out``).
Usage: ``python bench/cpu_per_create.py [--baseline REV] [--steps 600] [--rate 50] [--rounds 2]
[--out FILE]`` (under ``scripts/with_postgres.py --`` for PostgreSQL)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import baseline_tree  # noqa: E402
import hostquiet  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"


def run_once(tree: Path, out_dir: Path, tag: str, args: argparse.Namespace) -> dict[str, Any]:
    name = f"cpu_{tag}_{time.monotonic_ns()}"
    cmd = [
        sys.executable, "bench/scale_ramp.py", "--steps", str(args.steps), "--rate",
        str(args.rate), "--nodes", str(args.nodes), "--hold-s", "0", "--name", name,
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(tree)}
    quiet = hostquiet.settle()  # the run before it has torn down its pods and rows
    load = os.getloadavg()
    subprocess.run(cmd, cwd=tree, env=env, check=True, stdout=subprocess.DEVNULL)
    produced = tree / "bench" / "results" / f"{name}.json"
    step = json.loads(produced.read_text())["steps"][0]
    for suffix in (".json", ".html"):
        (tree / "bench" / "results" / f"{name}{suffix}").unlink(missing_ok=True)
    keep = (
        "requested", "ready", "pods_left_after_drain", "controller_cpu_s",
        "controller_cpu_ms_per_create", "controller_cpu_user_s", "controller_cpu_sys_s",
        "controller_cpu_s_by_thread", "standin_cpu_s", "write_batches", "burst_wall_s",
        "drain_s", "drain_cpu_ms_per_sandbox", "drain_cpu_s_by_thread",
    )  # fmt: skip
    return {
        "tree": tag,
        "host_before_run": quiet,
        "loadavg_at_start": [round(x, 2) for x in load],
    } | {k: step[k] for k in keep if k in step}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", default="706f7c6")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--rate", type=float, default=50.0)
    parser.add_argument("--nodes", type=int, default=150)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=RESULTS / "cpu_per_create.json")
    args = parser.parse_args()
    head = baseline_tree.head()
    with tempfile.TemporaryDirectory(prefix="sandman-cpu-baseline-") as tmp:
        # The baseline's scale_ramp must be the same measurement: this tree's.
        base = baseline_tree.extract(args.baseline, Path(tmp), same_bench=("scale_ramp.py",))
        runs = []
        for _ in range(args.rounds):
            runs.append(run_once(base, Path(tmp), "baseline", args))
            runs.append(run_once(ROOT, Path(tmp), "this", args))
    summary = {}
    for tag in ("baseline", "this"):
        values = [r["controller_cpu_ms_per_create"] for r in runs if r["tree"] == tag]
        summary[tag] = {"runs": len(values), "median_ms_per_create": statistics.median(values),
                        "min": min(values), "max": max(values)}  # fmt: skip
        drains = [r["drain_cpu_ms_per_sandbox"] for r in runs
                  if r["tree"] == tag and "drain_cpu_ms_per_sandbox" in r]  # fmt: skip
        if drains:  # the drain after the burst: each sandbox's delete, not in the figure above
            summary[tag]["drain_median_ms_per_sandbox"] = statistics.median(drains)
    baseline_tree.write_cpu_per_create(
        args.out,
        benchmark="cpu_per_create",
        what=f"controller CPU per create over one burst of {args.steps} acquires (job "
        f"bucket {args.rate}/s), baseline {args.baseline} and this tree ({head}) alternating",
        server="none (controller in process, no HTTP front); stand-in out of process",
        settings=baseline_tree.in_process_settings(),
        summary=summary,
        runs=runs,
    )


if __name__ == "__main__":
    main()
