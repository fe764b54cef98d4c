"""Fixtures for tests that run the real controller over the real local provider.

``controller``: a started :class:`Controller` whose LocalProvider is rooted in a fresh
directory (isolation from ``SANDMAN_LOCAL_ISOLATION``), installed with
``set_controller``. At teardown it is stopped and EVERY sandbox under the root is
destroyed by a fresh provider, so no execd process outlives the test. Tests using it
need ``transactional_db`` (the controller's threads have their own connections); the
fixture requests it.

``make_controller``: the same, for tests that need their own provider (a gate, a failing
destroy), their own clock, or two controllers in a row over one root (restart).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from sandboxes.controller import Controller, set_controller
from sandman_site.wiring import build_controller


def local_provider(root: Path, *, isolation: str | None = None, cls: type | None = None, **kw: Any):
    from sandboxes.providers.local.provider import LocalProvider

    klass = cls or LocalProvider
    return klass(
        root=root,
        images_dir=Path(settings.SANDMAN_IMAGES_DIR),
        isolation_mode=isolation or settings.SANDMAN_LOCAL_ISOLATION,
        execd_python=settings.SANDMAN_EXECD_PYTHON,
        **kw,
    )


def destroy_everything_under(root: Path) -> list[str]:
    """Destroy every sandbox a provider over ``root`` can list; return their names."""
    from sandboxes.providers.base import Handle

    async def run() -> list[str]:
        provider = local_provider(root, isolation="off")
        try:
            owned = await provider.list_owned()
            for item in owned:
                await provider.destroy(Handle(name=item.name, nonce=item.nonce, backend="local"))
            return [item.name for item in owned]
        finally:
            await provider.close()

    if not root.exists():
        return []
    return asyncio.run(run())


@pytest.fixture
def sandbox_root() -> Iterator[Path]:
    """A fresh root under /tmp with mode 0711: the sandbox user must traverse it (pytest's
    own tmp_path sits under a 0700 directory, which would switch isolation off)."""
    root = Path(tempfile.mkdtemp(prefix="sandman-test-root-", dir="/tmp"))
    os.chmod(root, 0o711)
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def spawner() -> Iterator[ThreadPoolExecutor]:
    """A thread that outlives controllers: sandboxes spawned from it survive a restart.

    When it ends (teardown), what it spawned gets its parent-death signal.
    """
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="test-spawner")
    yield pool
    pool.shutdown(wait=True)


@pytest.fixture
def make_controller(
    sandbox_root: Path, spawner: ThreadPoolExecutor, transactional_db: None
) -> Iterator[Callable[..., Controller]]:
    # ``spawner`` is set up first so it ends last: sandboxes are destroyed before it goes.
    built: list[Controller] = []

    def build(
        *,
        provider: Any = None,
        isolation: str | None = None,
        start: bool = True,
        wired: bool = False,
        **kw: Any,
    ) -> Controller:
        """``wired``: built by the service's start-up wiring (with the incidents hooks)."""
        kw.setdefault("sweep_interval_s", 0)  # tests call sweep() themselves
        kw.setdefault("maintenance_interval_s", 0.2)
        make = build_controller if wired else Controller
        controller = make(
            provider=provider or local_provider(sandbox_root, isolation=isolation), **kw
        )
        built.append(controller)
        if start:
            controller.start()
            set_controller(controller)
        return controller

    yield build
    for controller in built:
        controller.stop()
    set_controller(None)
    destroy_everything_under(sandbox_root)


@pytest.fixture
def controller(make_controller: Callable[..., Controller]) -> Controller:
    return make_controller()
