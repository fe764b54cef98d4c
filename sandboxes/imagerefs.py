"""Which image references fix the image a warm or reused grading sandbox serves (paper §4.3).

A warm pod is keyed by the image reference as requested, so only a reference that names
one image's content keeps a warm pod, a rollout and its grading on the same image. A
digest reference (``name@sha256:<64 hex>``) does; a tag (``name:tag``, or a bare name,
which means ``:latest``) is resolved again by every create and may move between them.

On the local backend an image is a template directory (or ``file:///dir``) whose workspace
is checked out at ``base_commit``: a full commit id names that tree by content, as a
digest does, so a local image with a full base commit counts as pinned; without one the
directory may change between creates, like a tag.

Rules a reader must not break: this is pure (no Django), and refusal is the caller's
decision — a job may opt in to tag references (``Job.reuse_allow_tags``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")
_FULL_COMMIT = re.compile(r"^(?:[0-9a-f]{40}|[0-9a-f]{64})$")


@dataclass(frozen=True)
class Pinning:
    pinned: bool
    how: str  # "digest", "commit" or "tag"


def image_pinning(image: str, base_commit: str | None, *, backend: str) -> Pinning:
    """How ``image`` (with ``base_commit``) is fixed on ``backend``."""
    if _DIGEST.search(image or ""):
        return Pinning(True, "digest")
    if backend == "local" and base_commit and _FULL_COMMIT.match(base_commit):
        return Pinning(True, "commit")
    return Pinning(False, "tag")


def tag_refusal(image: str, base_commit: str | None, *, backend: str, use: str) -> str | None:
    """The sentence refusing ``image`` for ``use`` (prewarm, reuse), or None if it is pinned."""
    if image_pinning(image, base_commit, backend=backend).pinned:
        return None
    pin = "a digest reference (name@sha256:...)"
    if backend == "local":
        pin += " or a local image at a full base_commit"
    return (
        f"image {image!r} is referenced by tag: every create resolves a tag again, so a "
        f"{use} grading sandbox may not run the image the rollout ran (paper §4.3). Use "
        f"{pin}, or create the job with reuse.allow_tag_images=true to accept that."
    )
