"""The stand-in is a cluster, not a part of Sandman: no Django, no service code, either way.

* Importing every module of ``standin`` (except ``standin.harness``, which drives Sandman's
  controller on purpose, and the tests) in a fresh interpreter loads no Django and nothing
  of Sandman's apps.
* No production module imports ``standin`` (the ``standin_cluster`` command loads it when
  it runs, and says so when it is missing).
* The keys the stand-in spells out itself (``standin/keys.py``) are still the ones the
  Kubernetes provider reads.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

from sandboxes import labels
from standin import keys

REPO = Path(__file__).resolve().parents[2]
APPS = ("sandboxes", "grading", "incidents", "dashboards", "sandman_site")
FRAMEWORKS = ("django", "rest_framework", "channels")

IMPORT_ALL = """
import json, pkgutil, sys
sys.path.insert(0, sys.argv[1])
import standin
names = sorted(
    m.name
    for m in pkgutil.walk_packages(standin.__path__, "standin.")
    if not m.name.startswith(("standin.harness", "standin.tests"))
)
for name in names:
    __import__(name)
print(json.dumps({"imported": names, "loaded": sorted(sys.modules)}))
"""


def test_no_standin_module_outside_the_harness_loads_django_or_sandman() -> None:
    out = subprocess.run(
        [sys.executable, "-I", "-c", IMPORT_ALL, str(REPO)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    answer = json.loads(out)
    assert {"standin.cluster", "standin.cli", "standin.clock", "standin.server"} <= set(
        answer["imported"]
    )
    leaked = [m for m in answer["loaded"] if m.split(".")[0] in APPS + FRAMEWORKS]
    assert leaked == []


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def test_no_production_module_imports_the_standin() -> None:
    offenders = []
    for app in APPS:
        for path in sorted((REPO / app).rglob("*.py")):
            if "tests" in path.relative_to(REPO).parts:
                continue
            if any(name.split(".")[0] == "standin" for name in _imports(path)):
                offenders.append(str(path.relative_to(REPO)))
    assert offenders == []


def test_the_provider_reads_no_key_only_the_standin_writes() -> None:
    assert keys.IMAGE_BYTES.startswith("standin.sandman.dev/")  # an input only it reads
    # Timings come from core/v1 Events and pod conditions, as on a real cluster: the
    # provider names no key that only the stand-in writes.
    read = [v for v in vars(labels).values() if isinstance(v, str)]
    assert [v for v in read if v.startswith("standin.sandman.dev/")] == []
