#!/usr/bin/env python3
"""Benchmark: grading with checked reuse vs a fresh sandbox per grading, in one run.

Runs in this process against a fresh PostgreSQL (run it under ``scripts/with_postgres.py``,
which sets ``DATABASE_URL``): migrates, builds a small task repository with real git (the
grading tests' ``calc`` task: a bug, its fix, official tests), starts the real controller
on the local backend (real execd) and the real grading runner, then for each mode grades
the same sequence of patches (the reference fix and the empty patch, alternating) one
after another:

* ``fresh``: a job without reuse, so every grading creates its sandbox (the baseline);
* ``checked_reuse``: a job with checked reuse: after each grading the controller resets,
  checks and restores the sandbox (execd ``/state/*``) and the next grading takes it back.

Recorded per mode: gradings per minute (wall clock of the whole sequence), creates per
grading (grading sandboxes of the job), the sources of the attempts, each verdict (they
must match across modes), and, for checked reuse, the check-and-restore time p50/p99 (the
``reuse_checked`` events' ``duration_ms``: execd's reset + check + restore, off the grading
path). ``run_modes`` is the function a wider grading benchmark can import.

One runner grades one patch at a time and, under checked reuse, waits for the check of
the sandbox it just released before the next grading (so that one sandbox is reused):
the check then sits on this sequential path, which a trainer with several grading
sandboxes in flight does not see. Gradings per minute here are therefore a lower bound
for checked reuse; creates per grading is the figure the option is for.

Results: ``bench/results/grading_reuse.json`` with the server, settings and load average.
Usage: ``scripts/with_postgres.py -- python bench/grading_reuse.py [--gradings 16]``
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "sandman_site.settings.test")

RESULTS = ROOT / "bench" / "results" / "grading_reuse.json"
MODES = {"fresh": False, "checked_reuse": True}


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return round(ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo), 1)


def run_mode(*, controller: Any, owner: Any, repo: Any, reuse: bool, gradings: int) -> dict:
    """Grade ``gradings`` patches on one new job; its numbers."""
    from django.utils import timezone

    from grading import services
    from grading.models import Task
    from grading.runner import GradingRunner
    from sandboxes import events
    from sandboxes.models import Sandbox, SandboxEvent
    from sandboxes.services import job_create

    job = job_create(
        owner=owner,
        name=f"bench-{'reuse' if reuse else 'fresh'}",
        egress="allow",
        reuse_enabled=reuse,
        now=timezone.now(),
    )
    task = Task.objects.get(instance_id="calc-1")
    runner = GradingRunner(controller=controller, acquire_timeout_s=120)
    verdicts, sources = [], []
    started = time.monotonic()
    for n in range(gradings):
        patch = repo.fix if n % 2 == 0 else ""
        grading = services.grading_create(
            job=job,
            task=task,
            patch=patch,
            capture=None,
            suite_names=None,
            created_by=owner,
            now=timezone.now(),
        )
        runner.run_once()
        grading.refresh_from_db()
        verdicts.append(grading.verdict)
        sources.append(grading.attempts[-1]["source"])
        if reuse:
            controller.wait_idle()  # the check of this grading's sandbox has finished
    wall_s = time.monotonic() - started
    controller.wait_idle()
    checks = [
        float(e.detail["duration_ms"])
        for e in SandboxEvent.objects.filter(kind=events.REUSE_CHECKED, sandbox__job=job)
    ]
    creates = Sandbox.objects.filter(job=job, role="grading").count()
    return {
        "gradings": gradings,
        "wall_s": round(wall_s, 2),
        "gradings_per_min": round(gradings * 60.0 / wall_s, 2),
        "creates": creates,
        "creates_per_grading": round(creates / gradings, 3),
        "sources": {s: sources.count(s) for s in sorted(set(sources))},
        "verdicts": verdicts,
        "check_and_restore_ms": {
            "n": len(checks),
            "p50": pct(checks, 0.5),
            "p99": pct(checks, 0.99),
        },
    }


def run_modes(*, gradings: int, root: Path) -> dict:
    """Both modes in one run (same controller, repository and patches); fresh first."""
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.utils import timezone

    from grading.services import task_create
    from grading.tests import harness_support as hs
    from sandboxes.controller import Controller

    call_command("migrate", verbosity=0)
    repo = hs.make_task_repo(root / "repo")
    owner, _ = get_user_model().objects.get_or_create(username="bench")
    task_create(
        created_by=owner,
        now=timezone.now(),
        fields={
            "instance_id": "calc-1",
            "repo": "sandman/calc",
            "base_commit": repo.base_commit,
            "patch": repo.fix,
            "test_patch": repo.test_patch,
            "fail_to_pass": hs.F2P,
            "pass_to_pass": hs.P2P,
            "image": repo.image,
            "suites": [{"name": "unit", "command": hs.PYTEST, "time_limit_s": 120}],
        },
    )
    sandboxes = root / "sandboxes"
    sandboxes.mkdir()
    os.chmod(sandboxes, 0o711)
    controller = Controller(provider=hs.provider_for(sandboxes), sweep_interval_s=0)
    controller.start()
    try:
        results = {
            mode: run_mode(
                controller=controller, owner=owner, repo=repo, reuse=reuse, gradings=gradings
            )
            for mode, reuse in MODES.items()
        }
    finally:
        controller.stop()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gradings", type=int, default=16)
    args = parser.parse_args()
    if not os.environ.get("DATABASE_URL", "").startswith("postgres"):
        sys.exit("run under scripts/with_postgres.py (DATABASE_URL must name PostgreSQL)")
    load_at_start = os.getloadavg()
    root = Path(tempfile.mkdtemp(prefix="sandman-bench-reuse-", dir="/tmp"))
    os.chmod(root, 0o711)
    try:
        modes = run_modes(gradings=args.gradings, root=root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    fresh, reused = modes["fresh"], modes["checked_reuse"]
    result = {
        "benchmark": "grading_reuse",
        "modes": modes,
        "baseline": "fresh (a sandbox created per grading), same run",
        "verdicts_match": fresh["verdicts"] == reused["verdicts"],
        "speedup_gradings_per_min": round(
            reused["gradings_per_min"] / fresh["gradings_per_min"], 3
        ),
        "server": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
        },
        "settings": {
            "backend": "local",
            "database": "postgresql",
            "patches": "reference fix and empty patch, alternating",
            "max_uses": 8,
        },
        "load_average_at_start": load_at_start,
        "load_average_at_end": os.getloadavg(),
        "note": "the host's other work shares its cores; compare runs only at similar load",
    }
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "modes"}, indent=2))
    for mode, numbers in modes.items():
        print(mode, json.dumps({k: v for k, v in numbers.items() if k != "verdicts"}))


if __name__ == "__main__":
    main()
