#!/usr/bin/env python3
"""Benchmark: gradings per minute on the shipped sample task set, per grading-sandbox mode.

In one process, against a fresh database (SQLite in a temp dir, or PostgreSQL when
``DATABASE_URL`` is set — run it under ``scripts/with_postgres.py``), it builds the sample
images (``grading.samples``), imports the tasks, starts a real controller over the local
backend and the real grading runner, and for each MODE

1. registers a job configured by the mode (``MODES``: a function from the mode name to job
   options; ``fresh`` = a never-used sandbox per attempt, no warm pool, no reuse),
2. queues ROUNDS x each task's reference patch through ``grading_create`` and runs the
   runner until every grading is done, timing the wall clock,
3. reads back the verdicts, each attempt's acquisition time and source, and the sandboxes
   the job created (creates per grading).

Same-run baseline: the same suites run directly on the host (``git worktree`` checkout at
the base commit, reference and test patches applied with ``git apply``, the task's suite
command) with no sandbox — what grading costs without Sandman.

Modes (``MODES``, all in one run, same controller and images): ``fresh``; ``warm`` (the job
keeps ``WARM_PER_KEY`` never-used grading sandboxes per key it has asked for, so a later
grading of a task finds one ready); ``reused`` (checked reuse: after each grading the
sandbox is reset, checked against its baseline and restored, then handed to the next
grading of the same key; check-and-restore time from the ``reuse_checked`` events).
``primes`` (a suite over its time limit: 3 timed-out
attempts, no verdict) is left out by default, since it measures the time limit, not Sandman.

Results: ``bench/results/grading.json`` (server, settings, load average around each run).
Usage: ``python bench/grading.py [--rounds 2] [--tasks slugs,clamp,temperature,weeks]``
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "grading.json"
# The sandbox's PATH (sandboxes/providers/local/isolation.py): the same python3 as inside.
SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
sys.path.insert(0, str(ROOT))


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))], 1)


def fresh_job_options() -> dict[str, Any]:
    return {"reuse_enabled": False, "warm_per_key": 0}


WARM_PER_KEY = 2


def warm_job_options() -> dict[str, Any]:
    return {"reuse_enabled": False, "warm_per_key": WARM_PER_KEY}


def reused_job_options() -> dict[str, Any]:
    return {"reuse_enabled": True, "warm_per_key": 0}


# mode name -> job options.
MODES: dict[str, Callable[[], dict[str, Any]]] = {
    "fresh": fresh_job_options,
    "warm": warm_job_options,
    "reused": reused_job_options,
}


def setup_django(tmp: Path) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "sandman_site.settings.dev")
    os.environ.setdefault("DATABASE_URL", f"sqlite:///{tmp / 'bench.sqlite3'}")
    os.environ["SANDMAN_CONTROLLER_AUTOSTART"] = "0"
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def baseline(lines: list[dict[str, Any]], images: Path, rounds: int, tmp: Path) -> dict[str, Any]:
    """The suites on the host, no sandbox: checkout, apply both patches, run the command."""
    durations = []
    load_before = os.getloadavg()
    for _ in range(rounds):
        for line in lines:
            started = time.monotonic()
            work = tmp / f"base-{line['instance_id']}"
            repo = images / line["image"]
            subprocess.run(
                ["git", "clone", "-q", "--no-checkout", str(repo), str(work)], check=True
            )
            subprocess.run(
                ["git", "-C", str(work), "checkout", "-q", line["base_commit"]], check=True
            )
            for patch in (line["patch"], line["test_patch"]):
                subprocess.run(
                    ["git", "-C", str(work), "apply", "-"], input=patch, text=True, check=True
                )
            subprocess.run(
                line["suites"][0]["command"],
                shell=True,
                cwd=work,
                env={"PATH": SANDBOX_PATH, "HOME": str(tmp), "LANG": "C.UTF-8"},
                capture_output=True,
                timeout=line["suites"][0]["time_limit_s"],
                check=False,
            )
            shutil.rmtree(work)
            durations.append((time.monotonic() - started) * 1000)
    total_s = sum(durations) / 1000
    return {
        "what": "the same suites on the host: clone, checkout, git apply both patches, run",
        "runs": len(durations),
        "per_minute": round(len(durations) / total_s * 60, 1),
        "ms_p50": _pct(durations, 0.5),
        "ms_p99": _pct(durations, 0.99),
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
    }


def run_mode(mode: str, controller: Any, tasks: list[Any], rounds: int) -> dict[str, Any]:
    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from grading import services
    from grading.models import Grading
    from grading.runner import GradingRunner
    from sandboxes import events
    from sandboxes.models import Sandbox, SandboxEvent
    from sandboxes.services.jobs import job_create

    owner, _ = get_user_model().objects.get_or_create(username="bench-grading")
    options = {"egress": "deny", **MODES[mode]()}
    job = job_create(owner=owner, now=timezone.now(), name=f"bench-{mode}", **options)
    load_before = os.getloadavg()
    started = time.monotonic()
    ids = [
        services.grading_create(
            job=job,
            task=t,
            patch=t.patch,
            capture=None,
            suite_names=None,
            created_by=owner,
            now=timezone.now(),
        ).pk
        for _ in range(rounds)
        for t in tasks
    ]
    runner = GradingRunner(controller=controller, acquire_timeout_s=120)
    while Grading.objects.filter(pk__in=ids).exclude(state="done").exists():
        runner.run_once()
    wall_s = time.monotonic() - started
    controller.wait_idle()  # the last check-and-restore (reused) or warm build has finished
    gradings = list(Grading.objects.filter(pk__in=ids))
    attempts = [a for g in gradings for a in g.attempts]
    acquire = [float(a["acquire_ms"]) for a in attempts if a.get("acquire_ms") is not None]
    created = Sandbox.objects.filter(job=job, role="grading").count()
    checks = [
        float(e.detail["duration_ms"])
        for e in SandboxEvent.objects.filter(kind=events.REUSE_CHECKED, sandbox__job=job)
        if "duration_ms" in e.detail
    ]
    verdicts: dict[str, int] = {}
    for g in gradings:
        verdicts[g.verdict] = verdicts.get(g.verdict, 0) + 1
    return {
        "job_options": options,
        "gradings": len(gradings),
        "wall_s": round(wall_s, 2),
        "gradings_per_minute": round(len(gradings) / wall_s * 60, 1),
        "verdicts": verdicts,
        "attempts": len(attempts),
        "creates": created,
        "creates_per_grading": round(created / len(gradings), 2),
        "acquire_ms_p50": _pct(acquire, 0.5),
        "acquire_ms_p99": _pct(acquire, 0.99),
        "acquire_sources": sorted({a.get("source", "") for a in attempts}),
        "check_and_restore": {
            "n": len(checks),
            "p50_ms": _pct(checks, 0.5),
            "p99_ms": _pct(checks, 0.99),
        },
        "grading_ms_p50": _pct(
            [float(a["duration_ms"]) for a in attempts if "duration_ms" in a], 0.5
        ),
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--tasks", default="slugs,clamp,temperature,weeks")
    parser.add_argument("--modes", default=",".join(MODES))
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="sandman-bench-grading-", dir="/tmp"))
    os.chmod(tmp, 0o755)
    try:
        setup_django(tmp)
        from django.conf import settings
        from django.db import connection

        from grading import samples
        from grading.tests.sample_support import import_samples, sample_provider
        from sandboxes.controller import Controller

        images = tmp / "images"
        images.mkdir()
        samples.build_all(images)
        settings.SANDMAN_IMAGES_DIR = images
        by_name = import_samples()
        names = args.tasks.split(",")
        tasks = [by_name[name] for name in names]
        root = tmp / "sandboxes"
        root.mkdir(mode=0o711)
        controller = Controller(provider=sample_provider(root, images), sweep_interval_s=0)
        controller.start()
        try:
            runs = {
                mode: run_mode(mode, controller, tasks, args.rounds)
                for mode in args.modes.split(",")
            }
        finally:
            controller.stop()
        lines = [
            line
            for line in samples.shipped_lines()
            if line["instance_id"] in {t.instance_id for t in tasks}
        ]
        base = baseline(lines, images, args.rounds, tmp)
        result = {
            "benchmark": "gradings per minute on the sample task set",
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "server": {
                "host": platform.node(),
                "cpus": os.cpu_count(),
                "python": platform.python_version(),
                "database": connection.vendor,
            },
            "settings": {
                "backend": settings.SANDMAN_BACKEND,
                "isolation": settings.SANDMAN_LOCAL_ISOLATION,
                "execd_python": settings.SANDMAN_EXECD_PYTHON,
                "egress": "deny",
                "tasks": names,
                "rounds": args.rounds,
            },
            "modes": runs,
            "baseline_host_suites": base,
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
