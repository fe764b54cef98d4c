#!/usr/bin/env python3
"""Benchmark: ``bench/acquire_latency.py`` on this tree beside a baseline commit, alternating.

Runs the REST acquire bench (split processes, production settings; run it under
``scripts/with_postgres.py`` for PostgreSQL) ``--rounds`` times from a ``git archive`` of
``--baseline`` and from this tree, one after the other, so both see the same machine and
load; the baseline runs THIS tree's ``bench/acquire_latency.py`` (the same measurement).
Each run starts once the host has gone quiet (``hostquiet.settle``: under 0.15 busy cores
over 2 s, at most 180 s; what was seen is under ``host_before_run``).
Each run is stored whole under ``runs``; ``summary`` gives per tree the range of the
headline figures beside issue 13's targets.

Results: ``bench/results/acquire_compare.json`` (``--out``).
Usage: ``python scripts/with_postgres.py -- python bench/acquire_compare.py
[--baseline REV] [--rounds 3] [--keyed] [--direct] [--out FILE]`` (``--keyed`` and ``--direct``
are passed to both trees' runs).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
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
FIGURES = {
    "serial_acquire_p50_ms": ("serial", "acquire_ms", "p50"),
    "concurrent_pairs_per_s": ("concurrent", "pairs_per_s"),
    "concurrent_acquire_p99_ms": ("concurrent", "acquire_ms", "p99"),
    "serial_baseline_get_p50_ms": ("serial", "baseline_get_job_ms", "p50"),
    "concurrent_host_busy_s": ("concurrent", "pair_bursts_cpu_s", "host_busy"),
    "concurrent_wall_s": ("concurrent", "pair_bursts_cpu_s", "wall_s"),
    "refill_host_busy_ms_per_create": ("concurrent", "refill_host_busy_ms_per_create"),
}


def figure(run: dict[str, Any], path: tuple[str, ...]) -> Any:
    value: Any = run
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    return value


def run_once(tree: Path, tag: str, tmp: Path, flags: list[str]) -> dict[str, Any]:
    quiet = hostquiet.settle()  # the run before it has torn down its sandboxes
    out = tmp / f"{tag}-{time.monotonic_ns()}.json"
    cmd = [sys.executable, "bench/acquire_latency.py", "--out", str(out), *flags]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    subprocess.run(cmd, cwd=tree, env=env, check=True, stdout=subprocess.DEVNULL)
    (run,) = json.loads(out.read_text())["runs"].values()
    return {"tree": tag, "host_before_run": quiet, **run}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", default="2a2e5ea")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--keyed", action="store_true", help="acquire_latency.py --keyed")
    parser.add_argument("--direct", action="store_true", help="acquire_latency.py --direct")
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/acquire_compare.json")
    args = parser.parse_args()
    flags = [f for f, on in (("--keyed", args.keyed), ("--direct", args.direct)) if on]
    head = baseline_tree.head()
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="sandman-acquire-compare-") as name:
        tmp = Path(name)
        base = baseline_tree.extract(args.baseline, tmp, same_bench=("acquire_latency.py",))
        for _ in range(args.rounds):
            runs.append(run_once(base, "baseline", tmp, flags))
            runs.append(run_once(ROOT, "this", tmp, flags))
    summary: dict[str, Any] = {}
    for tag in ("baseline", "this"):
        mine = [r for r in runs if r["tree"] == tag]
        summary[tag] = {}
        for name, path in FIGURES.items():
            values = [v for v in (figure(r, path) for r in mine) if v is not None]
            if values:
                summary[tag][name] = {"min": min(values), "max": max(values), "runs": values}
    result = {
        "benchmark": "acquire_compare",
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "what": f"bench/acquire_latency.py{''.join(' ' + f for f in flags)}, baseline "
        f"{args.baseline} and this tree ({head}) alternating, {args.rounds} runs each",
        "server": runs[0]["server"],
        "settings": runs[0]["settings"],
        "database": runs[0]["database"],
        "uvicorn": runs[0].get("uvicorn"),
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
        "targets": runs[0]["targets"],
        "reading": (
            "concurrent_host_busy_s is every process on the host inside the pair bursts "
            "(at most cpus x concurrent_wall_s); refill_host_busy_ms_per_create is what "
            "the host spends after a burst, per replacement create, until the pool is full "
            "again (the local backend's creates and the released sandboxes' deletes). Each "
            "run's load average at its start is in runs[]."
        ),
        "summary": summary,
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
