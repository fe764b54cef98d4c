"""Shared by the benches that run a baseline commit beside this tree (``acquire_compare.py``,
``cpu_per_create.py``, ``local_connect.py``, ``takeover.py``): the baseline's files as
``git archive`` gives them, in a directory of their own, and the machine's description
each result records.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import tarfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def extract(rev: str, into: Path, *, same_bench: tuple[str, ...] = ()) -> Path:
    """``rev``'s tree extracted to ``into``/tree (``into`` made readable by all: an isolated
    local sandbox's own user runs the baseline's execd from there). ``same_bench``: files
    under ``bench/`` copied from THIS tree, so both trees run the same measurement."""
    into.chmod(0o755)
    tree = into / "tree"
    tree.mkdir()
    archive = into / "baseline.tar"
    subprocess.run(["git", "archive", "-o", str(archive), rev], cwd=ROOT, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(tree, filter="data")
    archive.unlink()
    for name in same_bench:
        (tree / "bench" / name).write_text((ROOT / "bench" / name).read_text())
    return tree


def head() -> str:
    """This tree's commit, short (a result names it beside its baseline)."""
    return subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True, capture_output=True
    ).stdout.strip()


def in_process_settings() -> dict[str, Any]:
    """The settings of a bench whose controller runs in its own process, with the
    stand-in (``scale_ramp.py``, ``placement_rates.py``): the database is DATABASE_URL's
    (``scripts/with_postgres.py``) or a temp SQLite file; on PostgreSQL the server's own
    CPU is not in the figures."""
    url = os.environ.get("DATABASE_URL", "")
    return {
        "DJANGO_SETTINGS_MODULE": "sandman_site.settings.test",
        "database": "postgresql" if url.startswith(("postgres://", "postgresql://")) else "sqlite",
        "SANDMAN_K8S_VERIFY_HEALTH": "false",
    }


def write(out: Path, result: dict[str, Any]) -> None:
    """Store a result (its directory made if need be) and print its summary."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result.get("summary")))


def machine(**extra: Any) -> dict[str, Any]:
    """Python, cores and the load average now (a result's ``machine``)."""
    return {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        **extra,
    }


def write_cpu_per_create(
    out: Path,
    *,
    benchmark: str,
    what: str,
    server: str,
    settings: dict[str, Any],
    summary: dict[str, Any],
    runs: list[dict[str, Any]],
) -> None:
    """Store a controller-CPU-per-create result, issue 13 item 3's target beside it."""
    write(
        out,
        {
            "benchmark": benchmark,
            "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "what": what,
            "server": server,
            "settings": settings,
            "machine": machine(),
            "target_ms_per_create": 2.0,
            "summary": summary,
            "runs": runs,
        },
    )
