"""The sample task set shipped in ``sample_tasks/``: six small repositories, built into local
images and described in ``sample_tasks/tasks.jsonl`` (the SWE-bench instance format).

Each ``sample_tasks/NAME/`` holds ``base/`` (the buggy tree, committed as the base commit),
``fix/`` (files that make the reference patch), ``official/`` (files that make the
``test_patch``) and ``task.json`` (the rest of the instance). :func:`build_image` turns one
into the git repository ``IMAGES_DIR/sandman-sample/NAME`` — the local provider's image
``sandman-sample/NAME`` (``sandboxes/providers/local/images.py``).

Invariants:
* A build is deterministic: fixed author, committer, dates and message, so the base commit
  (and the patches, made with ``--full-index``) are the same on every machine; the shipped
  JSONL is what :func:`task_lines` produces, and a test holds them equal.
* The image repository's work tree is left clean at the base commit (the workspace of a
  sandbox is a checkout of it at that commit).
* Suites run the image's own ``python3`` (Debian's, with ``python3-pytest``), plugin
  autoload off, so a grading sees only the task's own configuration.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SAMPLE_DIR = Path(__file__).resolve().parent.parent / "sample_tasks"
JSONL_PATH = SAMPLE_DIR / "tasks.jsonl"
IMAGE_PREFIX = "sandman-sample"
TASK_SET = "sandman-sample"
NAMES = ("slugs", "pkgindex", "clamp", "temperature", "weeks", "primes")
SUITE_COMMAND = (
    "PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 PYTHONDONTWRITEBYTECODE=1 "
    "python3 -m pytest -rA -p no:cacheprovider"
)
DEFAULT_TIME_LIMIT_S = 120.0
_GIT_ENV = {
    "GIT_AUTHOR_NAME": "Sandman samples",
    "GIT_AUTHOR_EMAIL": "samples@sandman.invalid",
    "GIT_AUTHOR_DATE": "2026-01-01T00:00:00+0000",
    "GIT_COMMITTER_NAME": "Sandman samples",
    "GIT_COMMITTER_EMAIL": "samples@sandman.invalid",
    "GIT_COMMITTER_DATE": "2026-01-01T00:00:00+0000",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_TERMINAL_PROMPT": "0",
    "HOME": "/nonexistent",
    "LC_ALL": "C",
}
_GIT_CONFIG = ("-c", "commit.gpgsign=false", "-c", "core.autocrlf=false")


class SampleBuildError(Exception):
    """git failed while building a sample image (the message has its stderr)."""


@dataclass(frozen=True)
class BuiltSample:
    name: str
    image: str
    path: Path
    base_commit: str
    patch: str
    test_patch: str


def _git(repo: Path, *args: str) -> str:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **_GIT_ENV}
    done = subprocess.run(
        ["git", *_GIT_CONFIG, "-C", str(repo), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if done.returncode != 0:
        raise SampleBuildError(f"git {' '.join(args[:2])} in {repo}: {done.stderr.strip()}")
    return done.stdout


def _overlay(source: Path, target: Path) -> None:
    for path in sorted(source.rglob("*")):
        if path.is_file():
            dest = target / path.relative_to(source)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, dest)


def _diff_of(repo: Path, overlay: Path) -> str:
    """The diff that the overlay's files make on the base commit; the tree is reset after."""
    _overlay(overlay, repo)
    _git(repo, "add", "-A")
    patch = _git(repo, "diff", "--cached", "--full-index", "--no-color", "HEAD")
    _git(repo, "reset", "-q", "--hard", "HEAD")
    return patch


def build_image(name: str, images_dir: Path) -> BuiltSample:
    """(Re)build ``images_dir/sandman-sample/NAME`` from ``sample_tasks/NAME``."""
    source = SAMPLE_DIR / name
    repo = Path(images_dir) / IMAGE_PREFIX / name
    if repo.exists():
        shutil.rmtree(repo)
    repo.mkdir(parents=True)
    _overlay(source / "base", repo)
    (repo / ".gitignore").write_text("__pycache__/\n.pytest_cache/\n", encoding="utf-8")
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", f"{name}: the base commit of the sample task")
    base = _git(repo, "rev-parse", "HEAD").strip()
    patch = _diff_of(repo, source / "fix")
    test_patch = _diff_of(repo, source / "official")
    for directory in (repo.parent, repo):
        directory.chmod(0o755)  # readable by whoever clones a workspace from it
    return BuiltSample(name, f"{IMAGE_PREFIX}/{name}", repo, base, patch, test_patch)


def build_all(images_dir: Path) -> list[BuiltSample]:
    return [build_image(name, images_dir) for name in NAMES]


def task_line(built: BuiltSample) -> dict[str, Any]:
    """The JSONL object of one built sample (FAIL_TO_PASS/PASS_TO_PASS JSON-encoded strings,
    as SWE-bench ships them)."""
    meta = json.loads((SAMPLE_DIR / built.name / "task.json").read_text(encoding="utf-8"))
    line: dict[str, Any] = {
        "instance_id": meta["instance_id"],
        "repo": built.image,
        "base_commit": built.base_commit,
        "patch": built.patch,
        "test_patch": built.test_patch,
        "FAIL_TO_PASS": json.dumps(meta["FAIL_TO_PASS"]),
        "PASS_TO_PASS": json.dumps(meta["PASS_TO_PASS"]),
        "version": meta["version"],
        "environment_setup_commit": built.base_commit,
        "problem_statement": meta["problem_statement"],
        "hints_text": meta["hints_text"],
        "image": built.image,
        "suites": [
            {
                "name": "unit",
                "command": SUITE_COMMAND,
                "time_limit_s": float(meta.get("time_limit_s", DEFAULT_TIME_LIMIT_S)),
            }
        ],
    }
    if meta.get("conditions"):
        line["conditions"] = meta["conditions"]
    return line


def jsonl_text(built: list[BuiltSample]) -> str:
    return "".join(json.dumps(task_line(b), sort_keys=True) + "\n" for b in built)


def shipped_lines() -> list[dict[str, Any]]:
    """The shipped ``tasks.jsonl``, one dict per line."""
    text = JSONL_PATH.read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]
