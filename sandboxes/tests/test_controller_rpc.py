"""The controller's socket (``rpc.py``) and the web workers' facade over it (``remote.py``).

A real controller (local provider, real execd sandboxes) listens on a Unix socket in a
temp dir; ``RemoteController`` calls it as a web worker would, from its own event loop
and from a thread. Errors come back as the same ``SandmanError`` classes; a caller that
goes away cancels only its wait (the acquisition row ends ``cancelled``, the create goes on
and its pod is kept warm); a controller that is not there is a 503, never a hang.
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

import pytest

from sandboxes.controller import ControllerRpcServer, PrewarmKey, RemoteController
from sandboxes.models import Acquisition, Sandbox
from sandboxes.tests.api_support import wait_for
from sandboxes.tests.conftest import local_provider
from sandboxes.tests.controller_support import GatedProvider, acquire_args, make_job
from sandman_site.errors import ControllerUnavailable, JobNotActive, NotFound


@pytest.fixture
def socket_path():
    with tempfile.TemporaryDirectory(prefix="sandman-rpc-") as tmp:
        yield str(Path(tmp) / "controller.sock")


def serve(controller, path: str) -> ControllerRpcServer:
    server = ControllerRpcServer(controller, path)
    server.start()
    return server


def test_remote_calls_hand_out_release_and_raise_the_controllers_errors(controller, socket_path):
    server = serve(controller, socket_path)
    try:
        job = make_job(warm_per_key=0)
        remote = RemoteController(socket_path)
        args = acquire_args(job)
        remote.prewarm(
            job_id=job.pk,
            keys=[PrewarmKey(**{k: args[k] for k in ("image", "base_commit")},
                             cpu_millis=args["cpu_millis"], memory_bytes=args["memory_bytes"],
                             workspace_bytes=None, count=2)],
        )  # fmt: skip
        wait_for(lambda: Sandbox.objects.filter(job=job, state="ready").count() == 2)

        async def calls():
            first = await remote.aacquire(**args)
            second = await remote.aacquire(**args)  # the same connection, in turn
            assert await remote.ajob_of_in_use(sandbox_id=first.sandbox_id) == job.pk
            await remote.arelease(sandbox_id=first.sandbox_id)
            assert await remote.ajob_of_in_use(sandbox_id=first.sandbox_id) is None
            with pytest.raises(NotFound):
                await remote.aacquire(**{**args, "job_id": job.pk + 1000})
            return first, second

        first, second = asyncio.run(calls())
        assert {first.source, second.source} == {"warm"}
        assert first.sandbox_id != second.sandbox_id and first.token
        assert Sandbox.objects.get(pk=second.sandbox_id).state == "in_use"
        wait_for(lambda: Sandbox.objects.get(pk=first.sandbox_id).state == "deleted")
        remote.release(sandbox_id=second.sandbox_id)  # the sync form (a request thread)
        remote.drain(job_id=job.pk)
        with pytest.raises(JobNotActive):
            remote.acquire(**args)
    finally:
        server.stop()
    with pytest.raises(ControllerUnavailable):  # nothing listens any more: a clear 503
        RemoteController(socket_path).drain(job_id=job.pk)
    with pytest.raises(ControllerUnavailable):
        asyncio.run(RemoteController(socket_path).aacquire(**args))


def test_a_cancelled_remote_acquire_cancels_only_its_wait(make_controller, sandbox_root,
                                                          socket_path):  # fmt: skip
    provider = local_provider(sandbox_root, cls=GatedProvider)
    controller = make_controller(provider=provider)
    server = serve(controller, socket_path)
    try:
        job = make_job(warm_per_key=0)
        remote = RemoteController(socket_path)

        async def cut() -> None:
            waiting = asyncio.ensure_future(remote.aacquire(**acquire_args(job)))
            assert await asyncio.to_thread(provider.reached.wait, 60)  # the create is held
            assert not waiting.done(), waiting
            waiting.cancel()  # the HTTP client went away
            with pytest.raises(asyncio.CancelledError):
                await waiting

        asyncio.run(cut())
        wait_for(lambda: Acquisition.objects.filter(job=job, outcome="cancelled").count() == 1)
        provider.gate.set()  # the create goes on and its unused pod is kept
        wait_for(lambda: Sandbox.objects.filter(job=job, state="ready").count() == 1)
        assert not Acquisition.objects.filter(job=job, outcome="pending").exists()
    finally:
        provider.gate.set()
        server.stop()
