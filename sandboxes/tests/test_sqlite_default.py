"""The embedded default is SQLite: the suite runs on PostgreSQL, so the queries only
PostgreSQL has would pass here and 500 under ``scripts/serve``. This runs the training
records' API and page tests again in a child pytest on SQLite (no ``DATABASE_URL``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ON_SQLITE = [
    "sandboxes/tests/test_api_critical_path.py",
    "sandboxes/tests/test_api_trajectories.py",
    "dashboards/tests/pages/test_training.py",
]


def test_the_critical_path_and_trajectory_routes_work_on_sqlite() -> None:
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *ON_SQLITE],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and "failed" not in done.stdout
