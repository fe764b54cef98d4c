#!/usr/bin/env python3
"""Benchmark: SIGKILL the service during a 500-acquire burst on the stand-in, restart it.

The CI test (``sandboxes/tests/ownership/test_chaos_burst.py``) runs the same scenario
with a burst of 16 and a real execd behind every pod; this runs it at 500 acquires, 64 at
once in the killed controller process, with no execd behind the pods (500 execd processes
would not fit this shared machine beside the rest; readiness then skips the health call),
and the CI configuration in the same run as the baseline. Each variant runs the test
under ``scripts/with_postgres.py`` (a real PostgreSQL), and the test itself asserts the
outcome (no ownerless pod, every row matching the store, every in-flight create's row
ended ``deleted``, no pending delete left, every acquisition in flight at the kill ended
``failed`` with the reason ``service_restarted``; from a quarter answered on, acquisition
finishes are held so the kill cuts hand-outs whose answer never left: half of those are
retried with their ``Idempotency-Key`` and must get THAT sandbox, the rest are taken back
once the grace is over, and no sandbox is left in use without an ``ok`` acquisition) and
writes what it measured.

Results: ``bench/results/chaos_burst.json`` (both variants, the machine, the load
average before and after each). Usage: ``python bench/chaos_burst.py [--burst 500]``.
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

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "bench" / "results" / "chaos_burst.json"
TEST = "sandboxes/tests/ownership/test_chaos_burst.py"


def run(burst: int, execd: bool, workers: int, nodes: int) -> dict[str, object]:
    results = Path(tempfile.mkdtemp(prefix="sandman-chaos-")) / "out.json"
    env = {
        **os.environ,
        "SANDMAN_CHAOS_BURST": str(burst),
        "SANDMAN_CHAOS_EXECD": "1" if execd else "0",
        "SANDMAN_TEST_WORKERS": str(workers),
        "SANDMAN_CHAOS_NODES": str(nodes),
        "SANDMAN_CHAOS_RESULTS": str(results),
    }
    load_before = os.getloadavg()
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "scripts/with_postgres.py", "--", sys.executable, "-m", "pytest"]
        + ["-q", "-x", TEST, "-o", "timeout=3000"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    measured: dict[str, object] = json.loads(results.read_text()) if results.exists() else {}
    return {
        "passed": done.returncode == 0,
        "wall_s": round(time.monotonic() - started, 1),
        "workers_in_killed_process": workers,
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
        **measured,
        **({} if done.returncode == 0 else {"pytest_tail": done.stdout[-2000:]}),
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--burst", type=int, default=500)
    parser.add_argument("--workers", type=int, default=64)
    args = parser.parse_args()
    report = {
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "server": "controller in a child process (controller_proc.py), stand-in in the test "
        "process, PostgreSQL 15 (scripts/with_postgres.py)",
        "baseline_ci_configuration": run(16, True, 8, 4),
        "burst": run(args.burst, False, args.workers, 50),
    }
    OUT.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    return (
        0
        if all(v["passed"] for k, v in report.items() if isinstance(v, dict) and "passed" in v)
        else 1
    )


if __name__ == "__main__":
    sys.exit(main())
