#!/usr/bin/env python3
"""Benchmark: the create-rate sweep of ``placement_rates.py``, this tree beside a baseline
commit, alternating in one run.

Runs ``bench/placement_rates.py --parts rate_sweep --standin process`` (99 acquires fired
at once per rate, the job's bucket at r with burst 1, the stand-in in its own process) from
a ``git archive`` of ``--baseline`` and from this tree, ``--rounds`` times each, each run
once the host has gone quiet (``hostquiet.settle``); both run this tree's
``placement_rates.py`` and ``k8s_burst.py``, so only the service's code differs. Records
every run's achieved rate per target (the slope of the creates' ``create_sent`` times, when
they left the pacer) and its error, the controller process's CPU per create, and the load.

Results: ``bench/results/rate_sweep_compare.json`` (``--out``).
Usage: ``python bench/rate_sweep_compare.py --baseline REV [--rates 20,50,100,200]
[--rounds 3] [--out FILE]`` (under ``scripts/with_postgres.py --`` for PostgreSQL)
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


def run_once(tree: Path, tmp: Path, tag: str, rates: str) -> dict[str, Any]:
    out = tmp / f"sweep-{tag}-{time.monotonic_ns()}.json"
    quiet = hostquiet.settle()  # the run before it has drained its pods
    cmd = [
        sys.executable, "bench/placement_rates.py", "--parts", "rate_sweep", "--standin",
        "process", "--rates", rates, "--out", str(out),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(tree)}
    subprocess.run(cmd, cwd=tree, env=env, check=True, stdout=subprocess.DEVNULL)
    rows = json.loads(out.read_text())["rate_sweep"]
    out.unlink()
    keep = (
        "target_creates_per_s", "ready", "achieved_creates_per_s", "rate_error",
        "answered_creates_per_s", "cpu_ms_per_create_process", "standin_cpu_cores",
        "address_failures", "loadavg_at_start",
    )  # fmt: skip
    return {"tree": tag, "host_before_run": quiet, "rates": [{k: r[k] for k in keep} for r in rows]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", required=True)
    parser.add_argument("--rates", default="20,50,100,200")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS / "rate_sweep_compare.json")
    args = parser.parse_args()
    head = baseline_tree.head()
    with tempfile.TemporaryDirectory(prefix="sandman-sweep-baseline-") as name:
        tmp = Path(name)
        same = ("placement_rates.py", "k8s_burst.py")
        base = baseline_tree.extract(args.baseline, tmp, same_bench=same)
        runs = []
        for _ in range(args.rounds):
            runs.append(run_once(base, tmp, "baseline", args.rates))
            runs.append(run_once(ROOT, tmp, "this", args.rates))
    summary: dict[str, Any] = {}
    for rate in [int(r) for r in args.rates.split(",") if r]:
        summary[str(rate)] = {}
        for tag in ("baseline", "this"):
            achieved = [
                row["achieved_creates_per_s"]
                for run in runs
                if run["tree"] == tag
                for row in run["rates"]
                if row["target_creates_per_s"] == rate
            ]
            summary[str(rate)][tag] = {
                "achieved_creates_per_s": achieved,
                "median": statistics.median(achieved),
            }
    result = {
        "benchmark": "rate_sweep_compare",
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "what": "placement_rates.py's rate sweep (99 acquires per rate, job bucket burst 1, "
        f"stand-in out of process), baseline {args.baseline} and this tree ({head}) alternating",
        "server": "none (controller in process, no HTTP front); stand-in out of process",
        "settings": baseline_tree.in_process_settings(),
        "machine": baseline_tree.machine(),
        "summary": summary,
        "runs": runs,
    }
    baseline_tree.write(args.out, result)


if __name__ == "__main__":
    main()
