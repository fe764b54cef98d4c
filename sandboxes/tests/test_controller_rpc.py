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
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from sandboxes.controller import ControllerRpcServer, PrewarmKey, RemoteController
from sandboxes.models import Acquisition, Job, Sandbox
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


@dataclass
class Held:
    """A controller whose creates wait at ``provider.gate``, its socket, a job with no
    warm pool and a web worker's facade."""

    provider: GatedProvider
    server: ControllerRpcServer
    job: Job
    remote: RemoteController


@pytest.fixture
def held(make_controller, sandbox_root, socket_path) -> Iterator[Held]:
    provider = local_provider(sandbox_root, cls=GatedProvider)
    server = serve(make_controller(provider=provider), socket_path)
    try:
        yield Held(provider, server, make_job(warm_per_key=0), RemoteController(socket_path))
    finally:
        provider.gate.set()
        server.stop()


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


def test_a_cancelled_remote_acquire_cancels_only_its_wait(held):
    provider, job, remote = held.provider, held.job, held.remote

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


def test_an_orderly_stop_drains_the_calls_in_flight_and_refuses_new_ones(held, socket_path):
    """SIGTERM to ``run_controller``: the acquire waiting for its create still gets its
    sandbox; a call sent meanwhile on the same connection and a new connection are refused
    with ``controller_unavailable`` (the web worker's 503, resent by the client)."""
    provider, job, remote = held.provider, held.job, held.remote

    async def stop_under_a_call() -> tuple[object, dict[str, int]]:
        waiting = asyncio.ensure_future(remote.aacquire(**acquire_args(job)))
        assert await asyncio.to_thread(provider.reached.wait, 60)  # its create is held
        stopping = asyncio.ensure_future(asyncio.to_thread(held.server.stop, 300))

        def refused() -> bool:
            try:
                RemoteController(socket_path).ready()
            except ControllerUnavailable:
                return True
            return False

        await asyncio.to_thread(wait_for, refused)  # no new connection is taken
        with pytest.raises(ControllerUnavailable, match="stopping"):
            await remote.ajob_of_in_use(sandbox_id=1)  # a new call on the open one
        assert not waiting.done() and not stopping.done()
        provider.gate.set()  # the create ends: the drained call gets its answer
        return await waiting, await stopping

    result, counts = asyncio.run(stop_under_a_call())
    assert counts == {"drained": 1, "cut": 0}
    assert result.source == "created" and result.sandbox_id  # type: ignore[attr-defined]
    row = Acquisition.objects.get(job=job)
    assert (row.outcome, row.sandbox_id) == ("ok", result.sandbox_id)  # type: ignore[attr-defined]


def test_a_call_that_outlasts_the_drain_is_cut_as_a_503_and_its_wait_cancelled(held):
    provider, job, remote = held.provider, held.job, held.remote

    async def cut() -> dict[str, int]:
        waiting = asyncio.ensure_future(remote.aacquire(**acquire_args(job)))
        assert await asyncio.to_thread(provider.reached.wait, 60)
        counts = await asyncio.to_thread(held.server.stop, 0)  # no drain time at all
        with pytest.raises(ControllerUnavailable):
            await waiting
        return counts

    assert asyncio.run(cut()) == {"drained": 0, "cut": 1}
    wait_for(lambda: Acquisition.objects.filter(job=job, outcome="cancelled").count() == 1)
    provider.gate.set()  # the create goes on and its unused pod is kept
    wait_for(lambda: Sandbox.objects.filter(job=job, state="ready").count() == 1)


def test_a_web_workers_readyz_asks_the_controller_process_and_its_503s_say_when_to_retry(
    controller, socket_path, settings
):
    """Split processes: ``/readyz`` is 200 only while the controller process answers and
    has started; then 503 ``controller_unavailable`` with ``Retry-After``, as is a trainer's
    acquire (the client resends its keyed call after it)."""
    from django.test import Client
    from rest_framework.authtoken.models import Token

    from sandboxes.tests.api_support import api

    settings.SANDMAN_CONTROLLER_SOCKET = socket_path
    server = serve(controller, socket_path)
    try:
        ready = Client().get("/readyz")
        assert ready.status_code == 200, ready.content
        assert ready.json() == {
            "ok": True, "database": True, "leader_election": False, "controller": "started",
        }  # fmt: skip
    finally:
        server.stop()
    refused = Client().get("/readyz")
    assert refused.status_code == 503
    assert refused.json()["error"] == "controller_unavailable"
    assert refused.json()["controller"] == "unreachable"
    assert refused["Retry-After"] == "1"

    job = make_job(warm_per_key=0)
    token = Token.objects.create(user=job.owner).key
    answer = api(token).post(
        f"/api/v1/jobs/{job.pk}/acquire/",
        {"image": "sandman/empty", "spec": {"cpu": "250m", "memory": "256Mi"}},
        format="json",
        HTTP_IDEMPOTENCY_KEY="k-1",
    )
    assert answer.status_code == 503, answer.content
    assert answer.json()["error"] == "controller_unavailable"
    assert answer["Retry-After"] == "1"
    assert not Acquisition.objects.filter(job=job).exists()
