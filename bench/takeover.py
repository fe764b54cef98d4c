#!/usr/bin/env python3
"""Benchmark: a new controller's take-over of N live sandboxes (a new leader after a failover,
or a restart), this tree beside a baseline commit, alternating.

Each run is ``bench/scale_ramp.py --steps N --restart`` (THIS tree's script, also for the
baseline, so both measure the same thing): N acquires at once against the out-of-process
stand-in, all handed out; then the controller stops and a new one starts against the same
stand-in and database. Its ``start()`` reconciles before it returns (architecture §7): it
lists the pods, reads the rows, adopts every live sandbox and records an ``adopted`` event
for each. Recorded per run: that start's wall time and this process's CPU over it, the
adoptions, and the pods left after the drain that follows (must be 0).

Results: ``bench/results/takeover.json`` (``--out``).
Usage: ``python scripts/with_postgres.py -- python bench/takeover.py [--baseline REV]
[--n 2000] [--rate 100] [--rounds 2]``
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

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"


def run_once(tree: Path, tag: str, args: argparse.Namespace) -> dict[str, Any]:
    name = f"takeover_{tag}_{time.monotonic_ns()}"
    cmd = [
        sys.executable, "bench/scale_ramp.py", "--steps", str(args.n), "--rate", str(args.rate),
        "--burst", "20", "--hold-s", "0", "--restart", "--name", name,
    ]  # fmt: skip
    load = os.getloadavg()
    env = {**os.environ, "PYTHONPATH": str(tree)}
    subprocess.run(cmd, cwd=tree, env=env, check=True, stdout=subprocess.DEVNULL)
    step = json.loads((tree / "bench" / "results" / f"{name}.json").read_text())["steps"][0]
    for suffix in (".json", ".html"):
        (tree / "bench" / "results" / f"{name}{suffix}").unlink(missing_ok=True)
    return {
        "tree": tag,
        "loadavg_at_start": [round(x, 2) for x in load],
        "ready": step["ready"],
        **step["restart"],
        "pods_left_after_drain": step["pods_left_after_drain"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", default="3f8cb7c")
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=RESULTS / "takeover.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sandman-takeover-") as tmp:
        base = baseline_tree.extract(args.baseline, Path(tmp), same_bench=("scale_ramp.py",))
        runs = []
        for _ in range(args.rounds):
            for tag, tree in (("baseline", base), ("this", ROOT)):
                runs.append(run_once(tree, tag, args))
                print(json.dumps(runs[-1]), flush=True)
    summary = {
        tag: {
            "reconcile_wall_s_median": statistics.median(
                r["reconcile_wall_s"] for r in runs if r["tree"] == tag
            ),
            "reconcile_cpu_s_median": statistics.median(
                r["reconcile_cpu_s"] for r in runs if r["tree"] == tag
            ),
        }
        for tag in ("baseline", "this")
    }
    postgres = os.environ.get("DATABASE_URL", "").startswith("postgres")
    result = {
        "benchmark": "takeover",
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "what": f"a new controller's start (reconcile) over {args.n} live sandboxes, baseline "
        f"{args.baseline} and this tree alternating, {args.rounds} rounds",
        "server": "none (controller in process, no HTTP front); stand-in out of process",
        "settings": {
            "DJANGO_SETTINGS_MODULE": "sandman_site.settings.test",
            "database": "postgresql" if postgres else "sqlite",
            "SANDMAN_K8S_VERIFY_HEALTH": "false",
        },
        "machine": baseline_tree.machine(),
        "summary": summary,
        "runs": runs,
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
