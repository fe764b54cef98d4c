#!/usr/bin/env python3
"""Benchmark: every dashboard view and the critical-path API on a month of records.

Run it under a throwaway PostgreSQL (it refuses SQLite: the target is PostgreSQL's)::

    python scripts/with_postgres.py -- python bench/dashboards.py \\
        --sandboxes 1000000 --trajectories 100000

It migrates the fresh database, runs ``manage.py seed_history`` (timed: the issue asks for
minutes; skipped with ``--reuse`` when the database was seeded already, e.g. a cluster kept
alive with ``DATABASE_URL``), runs ``manage.py refresh_rollups`` (timed: the rollups'
backfill) and ``ANALYZE``, then requests, in-process through Django's test client (the whole
view: filter parsing, SQL, figures, template, JSON), every operator page and every chart's
JSON endpoint over the hour, the day and the 30 days ending at the newest record
(``from=&to=``, so a database seeded earlier is measured over the same rows), the same with
a job filter and a backend filter, and ``GET /api/v1/jobs/{id}/critical-path/`` of the
busiest training job (whole job and last hour). Each is requested ``--repeat`` times; the
JSON records every sample, the median and the max, beside the same-run baseline
(``/healthz``), the row counts, the server, the settings and the load average before and
after. Target (issue 11 item 6): every view answers within 1 s. Nothing is rounded toward
the target. Results: ``bench/results/dashboards.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "dashboards.json"
TARGET_S = 1.0
WINDOWS = {"1h": 60, "24h": 1440, "30d": 43200}  # minutes, ending at the anchor


def _setup() -> None:
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "sandman_site.settings.dev")
    os.environ["SANDMAN_CONTROLLER_AUTOSTART"] = "0"
    import django

    django.setup()


def _timed(client: Any, url: str, repeat: int, **extra: Any) -> dict[str, Any]:
    samples, status = [], None
    for _ in range(repeat):
        began = time.perf_counter()
        response = client.get(url, **extra)
        samples.append(time.perf_counter() - began)
        status = response.status_code
        if status != 200:
            raise SystemExit(f"{url}: HTTP {status}: {response.content[:300]!r}")
    return {
        "url": url,
        "status": status,
        "samples_s": [round(s, 4) for s in samples],
        "median_s": round(statistics.median(samples), 4),
        "max_s": round(max(samples), 4),
        "within_target": max(samples) <= TARGET_S,
    }


def _span(anchor: float, minutes: int) -> str:
    """``from=&to=`` of the ``minutes`` ending at ``anchor`` (the newest record's time), so a
    reused database is measured over the same records however long ago it was seeded."""
    return f"from={anchor - minutes * 60:.3f}&to={anchor:.3f}"


def _views(anchor: float, jobs: dict[str, int]) -> list[tuple[str, str]]:
    from dashboards.pages import operations, overview, training

    pages = {
        "/": ("/dashboard/data/", overview.CHARTS),
        "/operations/": ("/operations/data/", operations.CHARTS),
        "/training/": ("/training/data/", training.CHARTS),
    }
    views = []
    for label, minutes in WINDOWS.items():
        query = _span(anchor, minutes)
        for page, (data_url, charts) in pages.items():
            views.append((f"page {page} {label}", f"{page}?{query}"))
            for name in charts:
                views.append((f"chart {name} {label}", f"{data_url}{name}.json?{query}"))
    day, month = _span(anchor, 1440), _span(anchor, 43200)
    for page in pages:
        views.append((f"page {page} 24h job", f"{page}?{day}&job={jobs['training']}"))
        views.append((f"page {page} 24h backend", f"{page}?{day}&backend=kubernetes"))
        views.append((f"page {page} 30d job", f"{page}?{month}&job={jobs['busiest']}"))
    return views


def _counts() -> dict[str, int]:
    from sandboxes.models import (
        Acquisition,
        Job,
        LearnerStep,
        Sandbox,
        Trajectory,
        TrajectoryPhase,
    )

    models = (Job, Sandbox, Acquisition, Trajectory, TrajectoryPhase, LearnerStep)
    return {m._meta.db_table: m.objects.count() for m in models}


def _server() -> dict[str, Any]:
    from django.conf import settings
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT version()")
        version = cursor.fetchone()[0]
        cursor.execute("SHOW shared_buffers")
        shared = cursor.fetchone()[0]
        cursor.execute("SHOW work_mem")
        work_mem = cursor.fetchone()[0]
    return {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "postgresql": version,
        "shared_buffers": shared,
        "work_mem": work_mem,
        "settings": os.environ["DJANGO_SETTINGS_MODULE"],
        "debug": settings.DEBUG,
        "client": "django.test.Client, in-process (no HTTP server, no network)",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sandboxes", type=int, default=1_000_000)
    parser.add_argument("--trajectories", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="measure the database DATABASE_URL names if seed_history already filled it",
    )
    parser.add_argument("--only", default="", help="measure only views matching this regex")
    args = parser.parse_args()
    if not os.environ.get("DATABASE_URL", "").startswith("postgres"):
        raise SystemExit("run under scripts/with_postgres.py (or --reuse with DATABASE_URL)")
    _setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.db import connection
    from django.db.models import Count, Max
    from django.test import Client
    from rest_framework.authtoken.models import Token

    from sandboxes.models import Acquisition, Job, LearnerStep, Sandbox

    load_before = os.getloadavg()
    call_command("migrate", verbosity=0)
    seeded = get_user_model().objects.filter(username="history").exists()
    seed_s: float | None = None
    if not (args.reuse and seeded):
        began = time.monotonic()
        call_command(
            "seed_history",
            sandboxes=args.sandboxes,
            trajectories=args.trajectories,
            owner="history",
        )
        seed_s = time.monotonic() - began
    began = time.monotonic()
    call_command("refresh_rollups")
    refresh_s = time.monotonic() - began
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    staff, _ = get_user_model().objects.get_or_create(username="bench-op", is_staff=True)
    client = Client()
    client.force_login(staff)
    owner = get_user_model().objects.get(username="history")
    token = Token.objects.get_or_create(user=owner)[0].key
    last_job = LearnerStep.objects.order_by("-train_end").values_list("job_id", flat=True)[0]
    busiest = (
        Acquisition.objects.values("job_id").annotate(n=Count("pk")).order_by("-n")[0]["job_id"]
    )
    jobs = {"training": last_job, "busiest": busiest}
    baseline = _timed(client, "/healthz", args.repeat)
    results: dict[str, Any] = {}
    context = {
        "seed": {
            "sandboxes": args.sandboxes,
            "trajectories": args.trajectories,
            "seconds": None if seed_s is None else round(seed_s, 1),
            "reused_database": seed_s is None,
        },
        "refresh_rollups_s": round(refresh_s, 1),
        "rows": _counts(),
        "jobs": {**jobs, "total": Job.objects.count()},
        "baseline_healthz": baseline,
        "server": _server(),
        "repeat": args.repeat,
        "load_before": load_before,
    }
    auth = {"HTTP_AUTHORIZATION": f"Token {token}"}
    anchor = Sandbox.objects.aggregate(last=Max("requested_at"))["last"].timestamp()
    context["anchor"] = {"epoch_s": anchor, "is": "newest sandbox requested_at"}
    views = [(name, url, {}) for name, url in _views(anchor, jobs)]
    for name, query in (("whole job", ""), ("last hour", f"?from={anchor - 3600}&to={anchor}")):
        url = f"/api/v1/jobs/{last_job}/critical-path/{query}"
        views.insert(0, (f"api critical-path {name}", url, auth))
    if args.only:
        views = [v for v in views if re.search(args.only, v[0])]
    for name, url, extra in views:
        results[name] = _timed(client, url, args.repeat, **extra)
        print(f"{results[name]['max_s']:7.3f} s  {name}", flush=True)
        _write(args, context, results, complete=False)  # partial results survive a stop
    _write(args, context, results, complete=True)


def _write(
    args: argparse.Namespace, context: dict[str, Any], results: dict[str, Any], complete: bool
) -> None:
    slowest = max(results.items(), key=lambda kv: kv[1]["max_s"])
    report = {
        "benchmark": "dashboards",
        "complete": complete,
        "target": {"every_view_max_s": TARGET_S},
        **{k: v for k, v in context.items() if k != "load_before"},
        "summary": {
            "views": len(results),
            "within_target": sum(r["within_target"] for r in results.values()),
            "slowest": {"view": slowest[0], "max_s": slowest[1]["max_s"]},
        },
        "views": results,
        "load_average": {"before": context["load_before"], "now": os.getloadavg()},
        "command": (
            "DATABASE_URL=<a seeded cluster> python bench/dashboards.py"
            if args.reuse
            else "python scripts/with_postgres.py -- python bench/dashboards.py"
        )
        + f" --sandboxes {args.sandboxes} --trajectories {args.trajectories}"
        + f" --repeat {args.repeat}"
        + (" --reuse" if args.reuse else ""),
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2, default=str) + "\n")
    if complete:
        print(json.dumps(report["summary"]))


if __name__ == "__main__":
    main()
