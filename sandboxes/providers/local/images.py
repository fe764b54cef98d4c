"""Local images: how an image name and a base commit become a sandbox's workspace.

docs/architecture.md §9: image ``NAME`` is the template directory ``SANDMAN_IMAGES_DIR/NAME``;
``sandman/empty`` always exists (an empty workspace, no directory needed);
``file:///abs/dir`` uses that directory; with ``base_commit`` the template must be a git
repository and the workspace is a checkout at that commit.

Invariants:
* :func:`resolve_image` is the only judge of an image, and it runs BEFORE anything is
  created: every bad name, missing directory, non-git template with a commit, or unknown
  commit is an ``UnknownImage`` with a sentence a trainer can act on.
* A workspace never shares a writable inode with its template: directories are copied,
  git templates are cloned with ``--no-hardlinks`` (a later ``chown`` to the sandbox user
  would otherwise hand the template's own object files to the sandbox).
* Nothing here imports Django at module level; :func:`validate_image` reads the setting
  lazily so the REST layer can call it, while the provider passes ``images_dir``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

from sandman_site.errors import ProviderError, UnknownImage

EMPTY_IMAGE = "sandman/empty"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)*$")
# A commit-ish we are willing to hand to git: no option-looking or whitespace text.
_COMMIT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/^~-]{0,199}$")
_GIT_TIMEOUT_S = 60.0
_GIT_CONFIG = ("-c", "safe.directory=*", "-c", "advice.detachedHead=false")


@dataclass(frozen=True)
class ImageSource:
    """A resolved image: what to put in the workspace. ``commit`` is a full object name."""

    image: str
    kind: str  # "empty" | "dir" | "git"
    path: Path | None = None
    commit: str | None = None


def _git(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "GIT_TERMINAL_PROMPT": "0",
        "LC_ALL": "C",
        "HOME": "/nonexistent",
        "GIT_CONFIG_NOSYSTEM": "1",
    }
    return subprocess.run(
        ["git", *_GIT_CONFIG, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=_GIT_TIMEOUT_S,
        check=False,
    )


def _template_dir(image: str, images_dir: Path) -> Path:
    if image.startswith("file://"):
        parsed = urlparse(image)
        if parsed.netloc not in ("", "localhost") or parsed.query or parsed.fragment:
            raise UnknownImage(f"Image {image!r} is not a file:///absolute/dir address.")
        path = Path(unquote(parsed.path))
        if not path.is_absolute():
            raise UnknownImage(f"Image {image!r} must name an absolute directory.")
        where = "that directory"
    else:
        if not _NAME.match(image) or ".." in image.split("/"):
            raise UnknownImage(
                f"Image {image!r} is not a local image name (letters, digits, '.', '_', '-'"
                " and '/' between parts) or a file:///absolute/dir address."
            )
        base = images_dir.resolve()
        path = (base / image).resolve()
        if base != path and base not in path.parents:
            raise UnknownImage(f"Image {image!r} points outside the images directory.")
        where = f"{images_dir}/{image}"
    if not path.is_dir():
        raise UnknownImage(f"Image {image!r} is unknown: {where} is not a directory.")
    return path


def _resolve_commit(image: str, template: Path, base_commit: str) -> str:
    if not _COMMIT.match(base_commit):
        raise UnknownImage(f"base_commit {base_commit!r} is not a commit name.")
    if not (template / ".git").exists():
        raise UnknownImage(
            f"Image {image!r} has a base_commit but {template} is not a git repository "
            "(no .git at its top)."
        )
    try:
        done = _git("rev-parse", "--verify", "--quiet", f"{base_commit}^{{commit}}", cwd=template)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UnknownImage(f"git could not read {template}: {exc}") from exc
    sha = done.stdout.strip()
    if done.returncode != 0 or not re.fullmatch(r"[0-9a-f]{40,64}", sha):
        raise UnknownImage(f"Commit {base_commit!r} is not in the git repository of {image!r}.")
    return sha


def resolve_image(image: str, base_commit: str | None, *, images_dir: Path) -> ImageSource:
    """Judge ``image`` (+ ``base_commit``) and say what the workspace will hold."""
    if not isinstance(image, str) or not image:
        raise UnknownImage("An image name is required.")
    if base_commit is not None and not isinstance(base_commit, str):
        raise UnknownImage("base_commit must be a string.")
    base_commit = base_commit or None
    if image == EMPTY_IMAGE:
        if base_commit:
            raise UnknownImage(
                f"{EMPTY_IMAGE} is an empty workspace; a base_commit needs a git template."
            )
        return ImageSource(image=image, kind="empty")
    template = _template_dir(image, Path(images_dir))
    if base_commit:
        commit = _resolve_commit(image, template, base_commit)
        return ImageSource(image=image, kind="git", path=template, commit=commit)
    return ImageSource(image=image, kind="dir", path=template)


def validate_image(
    image: str, base_commit: str | None = None, *, images_dir: Path | None = None
) -> None:
    """Raise ``UnknownImage`` now if a create with this image would be refused.

    The REST layer calls this to answer 400 before queueing an acquire.
    """
    if images_dir is None:
        from django.conf import settings

        images_dir = Path(settings.SANDMAN_IMAGES_DIR)
    resolve_image(image, base_commit, images_dir=images_dir)


def materialize(source: ImageSource, workspace: Path) -> None:
    """Create ``workspace`` (which must not exist) holding what ``source`` describes."""
    if source.kind == "empty":
        workspace.mkdir(mode=0o755)
        return
    assert source.path is not None
    if source.kind == "dir":
        try:
            shutil.copytree(source.path, workspace, symlinks=True)
        except (OSError, shutil.Error) as exc:
            raise ProviderError(f"Could not copy template {source.path}: {exc}") from exc
        return
    assert source.commit is not None
    steps = (
        (
            "clone",
            "--no-checkout",
            "--no-hardlinks",
            "--quiet",
            "--",
            str(source.path),
            str(workspace),
        ),
        ("-C", str(workspace), "checkout", "--quiet", "--detach", source.commit),
    )
    for step in steps:
        try:
            done = _git(*step)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ProviderError(f"git {step[0]} failed for {source.image!r}: {exc}") from exc
        if done.returncode != 0:
            raise ProviderError(
                f"git {' '.join(step[:2])} failed for {source.image!r}: {done.stderr.strip()}"
            )


def _walk(root: Path) -> Iterator[str]:
    yield str(root)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            yield os.path.join(dirpath, name)


def chown_tree(root: Path, uid: int, gid: int) -> None:
    """Hand the workspace to the sandbox user (symlinks themselves, never their targets)."""
    for path in _walk(root):
        os.lchown(path, uid, gid)
