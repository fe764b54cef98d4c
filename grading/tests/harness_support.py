"""A small task repository built with real git, and a controller whose sandboxes can run pytest.

The template is a git repository used as ``file:///...`` image (the local backend's
workspaces are checkouts of it at the base commit). Sandboxes run execd on this test run's
own interpreter, so the suites can use its pytest (the local backend binds that
interpreter's prefixes into the sandbox).
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from django.conf import settings

from sandboxes.execd_client import ExecdClient
from sandboxes.tests.providers.local_support import git

T = TypeVar("T")

CALC = "def add(a, b):\n    return a - b\n"
CALC_FIXED = "def add(a, b):\n    return a + b\n"
TESTS = "from calc import add\n\n\ndef test_add_zero():\n    assert add(1, 0) == 1\n"
TESTS_OFFICIAL = TESTS + "\n\ndef test_add():\n    assert add(2, 2) == 4\n"
# Plugin autoload off: the suite sees only the task's own configuration.
PYTEST = f"PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 {sys.executable} -m pytest -rA -p no:cacheprovider"
F2P = ["tests/test_calc.py::test_add"]
P2P = ["tests/test_calc.py::test_add_zero"]
SPEC: dict[str, Any] = dict(cpu_millis=500, memory_bytes=256 * 2**20, workspace_bytes=None)


@dataclass(frozen=True)
class TaskRepo:
    path: Path
    base_commit: str
    fix: str  # the reference patch
    test_patch: str

    @property
    def image(self) -> str:
        return f"file://{self.path}"

    def grade_kwargs(self, **over: Any) -> dict[str, Any]:
        kwargs: dict[str, Any] = dict(
            base_commit=self.base_commit,
            patch=self.fix,
            test_patch=self.test_patch,
            fail_to_pass=F2P,
            pass_to_pass=P2P,
            suites=[{"name": "default", "command": PYTEST, "time_limit_s": 120}],
            excluded=["conftest.py", "pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml"],
        )
        kwargs.update(over)
        return kwargs


def diff_of(repo: Path, path: str, new_text: str) -> str:
    """The unified diff that turns ``path`` into ``new_text`` (made by git, then undone)."""
    target = repo / path
    old = target.read_text(encoding="utf-8") if target.exists() else None
    target.write_text(new_text, encoding="utf-8")
    git(repo, "add", "-N", path)
    patch = git(repo, "diff", "--no-color", "--", path) + "\n"
    if old is None:
        git(repo, "rm", "-q", "--cached", path)
        target.unlink()
    else:
        target.write_text(old, encoding="utf-8")
    return patch


def make_task_repo(root: Path) -> TaskRepo:
    repo = root / "calc"
    (repo / "tests").mkdir(parents=True)
    (repo / "calc.py").write_text(CALC, encoding="utf-8")
    (repo / "tests" / "__init__.py").write_text("", encoding="utf-8")
    (repo / "tests" / "test_calc.py").write_text(TESTS, encoding="utf-8")
    (repo / ".gitignore").write_text("__pycache__/\n", encoding="utf-8")
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "calc with a bug")
    os.chmod(root, 0o755)
    base = git(repo, "rev-parse", "HEAD")
    fix = diff_of(repo, "calc.py", CALC_FIXED)
    test_patch = diff_of(repo, "tests/test_calc.py", TESTS_OFFICIAL)
    return TaskRepo(path=repo, base_commit=base, fix=fix, test_patch=test_patch)


def provider_for(root: Path) -> Any:
    from sandboxes.providers.local.provider import LocalProvider

    return LocalProvider(
        root=root,
        images_dir=Path(settings.SANDMAN_IMAGES_DIR),
        isolation_mode=settings.SANDMAN_LOCAL_ISOLATION,
        execd_python=sys.executable,
    )


def with_execd(address: str, token: str, work: Callable[[ExecdClient], Awaitable[T]]) -> T:
    async def run() -> T:
        async with ExecdClient(address, token) as execd:
            return await work(execd)

    return asyncio.run(run())
