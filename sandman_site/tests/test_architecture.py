"""The shape of the house, checked: no import cycles, the stand-in stays a double, no mixins,
nothing points outside the repository.

These are the rules of docs/architecture.md §1 that a refactor can silently break. The import
graph is built by grimp (the library behind import-linter) from the source, so an import inside a
function counts as much as one at the top of a module: dodging a cycle with a late import does
not hide it.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("sandman_site", "sandboxes", "grading", "incidents", "dashboards", "execd", "rollups")
# The stand-in's harness half drives Sandman's controller (see standin/harness/__init__.py).
STANDIN_CORE_EXCLUDED = ("standin.harness", "standin.tests")


def _is_test_module(name: str) -> bool:
    parts = name.split(".")
    return "tests" in parts or "testing" in parts or "migrations" in parts


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    sys.path.insert(0, str(ROOT))
    try:
        return grimp.build_graph(
            *PRODUCT, "standin", include_external_packages=True, cache_dir=None
        )
    finally:
        sys.path.remove(str(ROOT))


def _cycles(graph: grimp.ImportGraph, modules: set[str]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for root in sorted(modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root) & modules)))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    imported = graph.find_modules_directly_imported_by(child) & modules
                    work.append((child, iter(sorted(imported))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_cycles_among_non_test_modules(graph: grimp.ImportGraph) -> None:
    modules = {
        m
        for m in graph.modules
        if m.split(".")[0] in (*PRODUCT, "standin") and not _is_test_module(m)
    }
    assert _cycles(graph, modules) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    """The check above could fail: a two-module cycle is reported."""
    g = grimp.ImportGraph()
    for name in ("a", "a.x", "a.y", "a.z"):
        g.add_module(name)
    g.add_import(importer="a.x", imported="a.y")
    g.add_import(importer="a.y", imported="a.x")
    g.add_import(importer="a.z", imported="a.x")
    assert _cycles(g, {"a.x", "a.y", "a.z"}) == [["a.x", "a.y"]]


def test_no_product_module_imports_the_standin(graph: grimp.ImportGraph) -> None:
    """The stand-in is a test double: production code never names it (CONVENTIONS §10).

    The ``standin_cluster`` management command is the one thin wrapper that runs it.
    """
    wrapper = "sandboxes.management.commands.standin_cluster"
    offenders = sorted(
        m
        for m in graph.modules
        if m.split(".")[0] in PRODUCT
        and not _is_test_module(m)
        and m != wrapper
        and any(i.split(".")[0] == "standin" for i in graph.find_modules_directly_imported_by(m))
    )
    assert offenders == []


def test_the_standin_core_imports_no_django_and_no_sandman(graph: grimp.ImportGraph) -> None:
    forbidden = {"django", "rest_framework", "channels", *PRODUCT}
    offenders = []
    for module in graph.modules:
        if module.split(".")[0] != "standin" or module.startswith(STANDIN_CORE_EXCLUDED):
            continue
        for imported in graph.find_modules_directly_imported_by(module):
            if imported.split(".")[0] in forbidden:
                offenders.append(f"{module} imports {imported}")
    assert offenders == []


def test_importing_the_standin_loads_no_django() -> None:
    code = (
        "import sys, standin, standin.server, standin.cluster\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('django', 'sandboxes', 'incidents', 'dashboards', 'grading', 'sandman_site'))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == ""


def _python_files() -> list[Path]:
    tracked = subprocess.run(
        ["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    return [ROOT / p for p in tracked]


def test_no_class_is_built_from_mixins_outside_tests_and_admin() -> None:
    """Collaborators receive what they use; no ``self`` shared across files (CONVENTIONS §8).

    Django's own mixins in the admin are a framework idiom, not ours.
    """
    offenders = []
    for path in _python_files():
        rel = path.relative_to(ROOT).as_posix()
        if "/tests/" in rel or rel.endswith("admin.py") or "/migrations/" in rel:
            continue
        tree = ast.parse(path.read_text(), filename=rel)
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                if node.name.endswith("Mixin"):
                    offenders.append(f"{rel}: class {node.name}")
                for base in node.bases:
                    name = ast.unparse(base)
                    if name.endswith("Mixin"):
                        offenders.append(f"{rel}: {node.name}({name})")
    assert offenders == []


def test_nothing_in_the_repository_points_outside_it() -> None:
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    pattern = re.compile(r"\.\./shared|shared/ARCHITECTURE|shared/paper")
    offenders = []
    for rel in tracked:
        if rel.startswith("bench/results/") or rel == "sandman_site/tests/test_architecture.py":
            continue
        path = ROOT / rel
        try:
            text = path.read_text()
        except (UnicodeDecodeError, FileNotFoundError):
            continue
        if pattern.search(text):
            offenders.append(rel)
    assert offenders == []


def test_every_path_the_paper_map_names_exists() -> None:
    """docs/paper-map.md names tests and benchmarks as ``path`` or ``path::test``."""
    text = (ROOT / "docs" / "paper-map.md").read_text()
    refs = set(re.findall(r"`([\w./-]+\.(?:py|json|md|js|html))(?:::(\w+))?`", text))
    assert refs, "the paper map names no file"
    missing = []
    for rel, test in sorted(refs):
        path = ROOT / rel
        if not path.exists():
            missing.append(rel)
        elif test and not re.search(rf"def {re.escape(test)}\b", path.read_text()):
            missing.append(f"{rel}::{test}")
    assert missing == []


def test_nothing_probes_a_provider_with_getattr_or_hasattr() -> None:
    """The Provider protocol declares everything the controller calls (docs §4)."""
    offenders = []
    for path in _python_files():
        rel = path.relative_to(ROOT).as_posix()
        if "/tests/" in rel or not rel.startswith("sandboxes/"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=rel)):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "hasattr")
                and node.args
                and "provider" in ast.unparse(node.args[0])
            ):
                offenders.append(f"{rel}:{node.lineno}")
    assert offenders == []
