"""Fixtures for the grading tests: the sandboxes tests' real controller over the local provider.

``make_controller`` (with ``sandbox_root`` and ``spawner``) is imported from the sandboxes
tests, so every sandbox a grading test starts is destroyed at teardown.
``repo``: a small task repository (real git); ``grader``: (user, token); ``sandboxes``:
``acquire(role)`` through a started controller for a job of ``grader``, answering the
controller's ``AcquireResult``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from grading.tests import harness_support as hs
from sandboxes.tests.api_support import make_job, make_user
from sandboxes.tests.conftest import (  # noqa: F401
    make_controller,
    sandbox_root,
    spawner,
)


@pytest.fixture
def repo(tmp_path_factory) -> hs.TaskRepo:
    return hs.make_task_repo(tmp_path_factory.mktemp("task-repo"))


@pytest.fixture
def grader(transactional_db) -> tuple[Any, str]:
    """The trainer who owns the grading job: (user, API token)."""
    return make_user("grader")


@pytest.fixture
def grading_controller(make_controller, sandbox_root: Path):  # noqa: F811
    """A started controller whose local sandboxes run execd on this interpreter (pytest)."""
    return make_controller(provider=hs.provider_for(sandbox_root))


@pytest.fixture
def grading_job(grading_controller, grader):
    # egress "allow": this interpreter may not be bindable into an isolated sandbox here.
    return make_job(grader[0], egress="allow")


@pytest.fixture
def sandboxes(grading_controller, grading_job, repo: hs.TaskRepo):
    def acquire(role: str):
        return grading_controller.acquire(
            job_id=grading_job.pk,
            image=repo.image,
            base_commit=repo.base_commit,
            role=role,
            timeout_s=60,
            **hs.SPEC,
        )

    return acquire


@pytest.fixture(scope="module")
def sample_images() -> Iterator[Path]:
    """The sample task set's images, built once per module under /tmp (sandbox-readable)."""
    from grading import samples

    root = Path(tempfile.mkdtemp(prefix="sandman-sample-images-", dir="/tmp"))
    os.chmod(root, 0o755)
    samples.build_all(root)
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def sample_controller(make_controller, sandbox_root: Path, sample_images: Path, settings):  # noqa: F811
    """A started controller whose provider resolves ``sandman-sample/NAME`` images."""
    from grading.tests.sample_support import sample_provider

    settings.SANDMAN_IMAGES_DIR = sample_images
    return make_controller(provider=sample_provider(sandbox_root, sample_images))
