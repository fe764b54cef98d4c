"""Helpers for the controller's integration tests: jobs, execd calls, processes, gates.

Providers here are the REAL LocalProvider with one behaviour changed for a test:
``GatedProvider`` holds readiness until the test opens a gate (deterministic late
creates, no sleeps); ``SurvivingProvider`` spawns from a thread the test owns so
sandboxes outlive a stopped controller; ``FailingDestroyProvider`` fails every delete
(pending deletes).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import secrets
import threading
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from django.contrib.auth import get_user_model

from sandboxes.models import Job, Sandbox, SandboxEvent
from sandboxes.providers.base import Handle, ReadyInfo, SandboxSpec
from sandboxes.providers.local import procs, records
from sandboxes.providers.local.provider import LocalProvider
from sandboxes.services import job_create
from sandboxes.tests.api_support import wait_for
from sandboxes.tests.http_support import post_json
from sandman_site.errors import ProviderError

MiB = 2**20
SPEC = {"cpu_millis": 500, "memory_bytes": 256 * MiB, "workspace_bytes": None}
IMAGE = "sandman/empty"


def make_job(**over: Any) -> Job:
    owner, _ = get_user_model().objects.get_or_create(username="trainer")
    kwargs: dict[str, Any] = {"name": "run", "egress": "allow"}
    kwargs.update(over)
    return job_create(owner=owner, now=dt.datetime.now(dt.UTC), **kwargs)


def acquire_args(job: Job, **over: Any) -> dict[str, Any]:
    args: dict[str, Any] = {
        "job_id": job.pk,
        "image": IMAGE,
        "base_commit": None,
        "role": "rollout",
        "timeout_s": 60.0,
        **SPEC,
    }
    args.update(over)
    return args


def execd(address: str, token: str, path: str, payload: dict[str, Any]) -> dict[str, Any]:
    """POST ``payload`` to execd at ``address`` with the sandbox's bearer token."""
    return post_json(
        f"http://{address}{path}", payload, headers={"Authorization": f"Bearer {token}"}
    )


def pid_of(root: Path, name: str) -> int:
    record = records.read(root / name)
    assert record is not None and record.pid, f"no record with a pid for {name}"
    return int(record.pid)


def process_alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie."""
    return procs.state(pid) not in (None, "Z")


# Poll an observable state until it holds (a generous deadline, not a timing claim): the
# one poll loop of the test helpers, under the name the controller tests use.
wait_until = wait_for


def state(sandbox_id: int) -> str:
    return Sandbox.objects.get(pk=sandbox_id).state


def kinds(sandbox_id: int) -> list[str]:
    return list(
        SandboxEvent.objects.filter(sandbox_id=sandbox_id)
        .order_by("at", "id")
        .values_list("kind", flat=True)
    )


class GatedProvider(LocalProvider):
    """Readiness waits until the test opens ``gate``; ``reached`` says a create got there."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.gate = threading.Event()
        self.reached = threading.Event()
        self.held = 0

    async def wait_ready(self, handle: Handle, budget_s: float) -> ReadyInfo:
        self.held += 1
        self.reached.set()
        await asyncio.to_thread(self.gate.wait)
        return await super().wait_ready(handle, budget_s)


class OutlivedProvider(LocalProvider):
    """Readiness fails only once the task that asked for it has ended (cancelled at stop).

    ``wait_ready`` is called in the awaiting task, so it can name that task; the returned
    coroutine runs in the controller's inner future and ends with an error the caller is
    no longer there to receive -- the shape of a readiness wait cut off by shutdown.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.reached = threading.Event()

    def wait_ready(self, handle: Handle, budget_s: float) -> Coroutine[Any, Any, ReadyInfo]:
        caller = asyncio.current_task()
        assert caller is not None
        return self._fail_after(caller, handle)

    async def _fail_after(self, caller: asyncio.Task[Any], handle: Handle) -> ReadyInfo:
        self.reached.set()
        await asyncio.wait({caller})
        raise ProviderError(f"readiness of {handle.name} abandoned: its caller left")


class SurvivingProvider(LocalProvider):
    """Spawns sandboxes from a thread the TEST owns (``spawner``), not the controller's.

    A local sandbox ends with the thread that spawned it (--die-with-parent), i.e. with a
    stopped controller's loop thread. Spawning from a longer-lived thread lets sandboxes
    outlive one controller, as pods outlive a restarted service, so a second controller
    has something to adopt.
    """

    def __init__(self, *args: Any, spawner: ThreadPoolExecutor, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._spawner = spawner

    def _spawn(self, *args: Any, **kwargs: Any) -> Any:
        spawn = super()._spawn
        return self._spawner.submit(spawn, *args, **kwargs).result()


class FailingDestroyProvider(SurvivingProvider):
    """Every delete fails as an unconfirmed one would; the sandbox stays."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.destroy_calls = 0

    async def destroy(self, handle: Handle) -> None:
        self.destroy_calls += 1
        raise ProviderError(f"injected failure: delete of {handle.name} not confirmed")


def create_unknown_sandbox(root: Path, *, job_id: int = 999) -> tuple[str, int]:
    """A labelled sandbox under ``root`` that no database row owns; returns (name, pid)."""
    from django.conf import settings

    name = f"sm-{job_id}-{secrets.token_hex(6)}"
    spec = SandboxSpec(
        name=name,
        nonce=secrets.token_hex(16),
        token=secrets.token_urlsafe(32),
        job_id=job_id,
        role="rollout",
        image=IMAGE,
        base_commit=None,
        egress="allow",
        key_hash="0" * 16,
        **SPEC,
    )

    async def run() -> None:
        provider = LocalProvider(
            root=root,
            images_dir=Path(settings.SANDMAN_IMAGES_DIR),
            isolation_mode="off",
            execd_python=settings.SANDMAN_EXECD_PYTHON,
        )
        try:
            handle = await provider.create(spec)
            await provider.wait_ready(handle, 60.0)
        finally:
            await provider.close()

    asyncio.run(run())
    return name, pid_of(root, name)
