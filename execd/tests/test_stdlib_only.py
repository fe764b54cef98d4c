"""execd runs under the task image's own python3: standard library only, and it
must parse (and run) on Python 3.8."""

import ast
import glob
import os
import shutil
import subprocess
import sys

import pytest

from execd.tests.helpers import REPO_ROOT, TOKEN

pytestmark = pytest.mark.timeout(60)

PACKAGE = os.path.join(REPO_ROOT, "execd")
SOURCES = sorted(glob.glob(os.path.join(PACKAGE, "*.py")))


def test_there_are_sources_to_check() -> None:
    names = {os.path.basename(p) for p in SOURCES}
    assert {
        "__init__.py",
        "__main__.py",
        "server.py",
        "shell.py",
        "files.py",
        "probe.py",
        "state.py",
    } <= names


@pytest.mark.parametrize("path", SOURCES, ids=os.path.basename)
def test_every_module_parses_as_python_38_and_imports_only_the_stdlib(path: str) -> None:
    with open(path) as f:
        source = f.read()
    tree = ast.parse(source, filename=path, feature_version=(3, 8))
    allowed = set(sys.stdlib_module_names) | {"execd"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            mods = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            mods = [node.module or ""] if node.level == 0 else []
        else:
            continue
        for mod in mods:
            assert mod.split(".")[0] in allowed, "%s imports %s" % (path, mod)
    assert ast.get_docstring(tree), "%s opens without a docstring" % path
    assert len(source.splitlines()) <= 420, "%s is past ~400 lines" % path


def _python38() -> str:
    for candidate in ("python3.8", os.path.expanduser("~/.pyenv/versions/3.8.18/bin/python3.8")):
        found = shutil.which(candidate) or (candidate if os.path.exists(candidate) else None)
        if found:
            ok = subprocess.run(
                [found, "-c", "import sys; assert sys.version_info[:2] == (3, 8)"],
                capture_output=True,
            )
            if ok.returncode == 0:
                return found
    return ""


@pytest.mark.skipif(not _python38(), reason="no Python 3.8 interpreter on this machine")
def test_execd_really_runs_on_python_38(start_execd) -> None:
    """Annotations and defaults are evaluated at import: only a real 3.8 catches
    builtin generics or new stdlib calls that ast.parse lets through."""
    d = start_execd(python=_python38())
    c = d.client()
    assert c.exec("echo $((6*7))")["output"] == "42\n"
    assert c.exec("sleep 30", timeout_s=1)["exit_code"] == 124
    assert c.post("/files/write", {"path": "x.txt", "content": "hi\n"})["size"] == 3
    assert c.get("/probe")["readings"]["uid"]["value"] == os.getuid()
    assert TOKEN not in c.exec("env")["output"]
    c.close()
