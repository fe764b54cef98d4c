"""Shared by the benches that run a baseline commit beside this tree (``acquire_compare.py``,
``cpu_per_create.py``, ``local_connect.py``, ``takeover.py``): the baseline's files as
``git archive`` gives them, in a directory of their own, and the machine's description
each result records.
"""

from __future__ import annotations

import os
import platform
import subprocess
import tarfile
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


def machine(**extra: Any) -> dict[str, Any]:
    """Python, cores and the load average now (a result's ``machine``)."""
    return {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        **extra,
    }
