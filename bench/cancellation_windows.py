#!/usr/bin/env python3
"""Benchmark: Table A21's 25 cancellation windows x 20 and 1,000 randomized trials.

Runs the SAME window code as the CI tests (``standin/harness/windows.py`` and
``randomized.py``): the real controller on the real Kubernetes provider, over HTTP to the
stand-in cluster (virtual time, a real execd per pod, a sentinel pod of another tenant),
with the independent auditor listing the stand-in's pod store while each window is held,
after its release and during the drain. Each window runs REPEATS times on one rig (one
stand-in + controller; every trial is its own job); a trial that fails gets a fresh rig.

Recorded per window: trials, ``hit`` (every gate it armed was reached and every failure
plan fired), pods without an owner (target 0), failures (any assertion of the window or
of the final check: no pod, no anchor, no pending delete, sentinels untouched), and the
median ms from the trigger to the caller's answer (``caller_ms``), to the pod's delete
when the window itself deleted it (``delete_ms``; the drain at the end does not count)
and to the end of the hold (``hold_ms``: holds end right after the in-window audit, not
after a fixed 50 ms as in the paper). The randomized part records the same per draw.

Database: a fresh SQLite file in a temp dir (migrated here), or ``DATABASE_URL`` (run
under ``scripts/with_postgres.py``). Results: ``bench/results/cancellation_windows.json``.

Usage: ``python bench/cancellation_windows.py [--repeats 20] [--random 1000] [--seed 1]``
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "cancellation_windows.json"


def setup_django(tmp: Path) -> str:
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "sandman_site.settings.test")
    if not os.environ.get("DATABASE_URL"):
        os.environ["DATABASE_URL"] = f"sqlite:///{tmp / 'bench.sqlite3'}"
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)
    for name in ("sandboxes", "asyncio", "kubernetes", "urllib3", "aiohttp"):
        logging.getLogger(name).setLevel(logging.CRITICAL)  # failures are expected here
    from django.db import connection

    return connection.vendor


def median(values: list[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return round(statistics.median(kept), 2) if kept else None


def run_windows(repeats: int) -> list[dict[str, Any]]:
    from standin.harness.rig import Rig, Trial
    from standin.harness.windows import WINDOWS

    out = []
    for window in WINDOWS:
        rows: list[dict[str, Any]] = []
        rig = Rig(**window.rig).start()
        started = time.monotonic()
        try:
            for _ in range(repeats):
                trial = Trial(rig, **window.job)
                error = ""
                try:
                    window.run(trial)
                    trial.settle()
                except Exception as exc:  # recorded; the next trial gets a fresh rig
                    error = f"{type(exc).__name__}: {exc}"[:500]
                ownerless = sorted({n for a in trial.audits for n in a.ownerless})
                rows.append(
                    {"hit": trial.hit, "ownerless": ownerless, "error": error, **trial.timing()}
                )
                if error:
                    rig.stop()
                    rig = Rig(**window.rig).start()
        finally:
            rig.stop()
        out.append(
            {
                "window": window.number,
                "title": window.title,
                "outcome": window.outcome,
                "trials": len(rows),
                "hit": sum(r["hit"] for r in rows),
                "pods_without_owner": sum(len(r["ownerless"]) for r in rows),
                "failures": sum(bool(r["error"]) for r in rows),
                "errors": sorted({r["error"] for r in rows if r["error"]})[:3],
                "caller_ms_median": median([r["caller_ms"] for r in rows]),
                "delete_ms_median": median([r["delete_ms"] for r in rows]),
                "hold_ms_median": median([r["hold_ms"] for r in rows]),
                "seconds": round(time.monotonic() - started, 2),
            }
        )
        print(json.dumps(out[-1]), flush=True)
    return out


def run_random(trials: int, seed: int) -> dict[str, Any]:
    from standin.harness.randomized import draw, run_trial
    from standin.harness.rig import Rig

    rows: list[dict[str, Any]] = []
    rig = Rig(nodes=3, seed=seed).start()
    started = time.monotonic()
    try:
        for index in range(trials):
            d = draw(index, seed)
            error = ""
            try:
                run_trial(rig, d)
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"[:500]
                rig.stop()
                rig = Rig(nodes=3, seed=seed + index + 1).start()
            rows.append({**d.as_dict(), "error": error})
    finally:
        rig.stop()
    return {
        "trials": len(rows),
        "seed": seed,
        "reached": sum(r["reached"] for r in rows),
        "pods_without_owner": sum(len(r["ownerless"]) for r in rows),
        "failures": sum(bool(r["error"]) for r in rows),
        "errors": sorted({r["error"] for r in rows if r["error"]})[:5],
        "by_gate": dict(Counter(r["gate"] for r in rows)),
        "by_trigger": dict(Counter(r["trigger"] for r in rows)),
        "by_create_plan": dict(Counter(str(r["create_plan"]) for r in rows)),
        "by_delete_plan": dict(Counter(str(r["delete_plan"]) for r in rows)),
        "by_pod_plan": dict(Counter(str(r["pod_plan"]) for r in rows)),
        "by_caller_outcome": dict(Counter(r["caller"] or "prewarm" for r in rows)),
        "trial_seconds_median": median([r["seconds"] for r in rows]),
        "seconds": round(time.monotonic() - started, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--random", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sandman-bench-windows-") as tmp:
        vendor = setup_django(Path(tmp))
        load_before = os.getloadavg()
        started = time.monotonic()
        windows = run_windows(args.repeats)
        randomized = run_random(args.random, args.seed)
        elapsed = time.monotonic() - started
    total = sum(w["trials"] for w in windows) + randomized["trials"]
    result = {
        "benchmark": "cancellation_windows",
        "what": "Table A21 windows end to end: controller + Kubernetes provider + stand-in "
        "(virtual time, real execd per pod), independent audit of the pod store",
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "database": vendor,
            "loadavg_before": [round(x, 2) for x in load_before],
            "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        },
        "repeats_per_window": args.repeats,
        "totals": {
            "trials": total,
            "window_trials_hit": sum(w["hit"] for w in windows),
            "random_trials_reached": randomized["reached"],
            "pods_without_owner": sum(w["pods_without_owner"] for w in windows)
            + randomized["pods_without_owner"],
            "target_pods_without_owner": 0,
            "failures": sum(w["failures"] for w in windows) + randomized["failures"],
            "seconds": round(elapsed, 1),
        },
        "windows": windows,
        "randomized": randomized,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["totals"], indent=2))


if __name__ == "__main__":
    main()
