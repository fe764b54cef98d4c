"""The Python client against a LIVE server (pytest-django's threaded ``live_server``),
the real controller, local provider and execd: the trainer's whole path over HTTP."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from sandboxes.client import Client, SandmanClientError
from sandboxes.models import Job, Sandbox
from sandboxes.tests.api_support import make_user, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

SPEC = {"cpu": "500m", "memory": "256Mi"}


@pytest.fixture
def client(controller, live_server) -> Any:
    _, token = make_user("client-user")
    with Client(live_server.url, token) as c:
        yield c


def _state(sandbox_id: int) -> str:
    return Sandbox.objects.get(pk=sandbox_id).state


def test_a_rollout_through_the_client_runs_commands_files_and_reset_then_releases(client):
    job = client.job(name="client-run", egress="allow", caps={"max_live": 8})
    assert job.refresh().counts == {"live": 0, "warm": 0, "creating": 0}
    with job.acquire(image="sandman/empty", spec=SPEC, role="rollout", timeout_s=60) as sb:
        assert sb.source == "created" and sb.wait_ms >= sb.queue_ms >= 0
        assert sb._token not in repr(sb)
        assert sb.run("echo hello").output.strip() == "hello"
        assert sb.run("exit 3").exit_code == 3
        sb.run("mkdir -p src && cd src")
        assert sb.run("pwd").output.strip().endswith("/src")
        assert sb.run("ls", cwd="/").exit_code == 0

        text = "first\nsecond\n"
        written = sb.write("src/a.txt", text)
        assert written.sha256 == hashlib.sha256(text.encode()).hexdigest()
        read = sb.read("src/a.txt")
        assert (read.content, read.sha256, read.size) == (text, written.sha256, len(text))

        blob = bytes(range(256)) + b"\r\n\xff\xfe"
        wrote_blob = sb.write("src/blob.bin", blob)
        got = sb.read_bytes("src/blob.bin")
        assert got.data == blob and got.sha256 == wrote_blob.sha256

        with pytest.raises(SandmanClientError) as stale:
            sb.write("src/a.txt", "clobber", expected_sha256="0" * 64)
        assert stale.value.status == 409
        assert sb.read("src/a.txt").content == text  # the refused write changed nothing

        sb.run("sleep 300 > /dev/null 2>&1 &")
        sb.reset()
        assert sb.run("echo after-reset").output.strip() == "after-reset"
        sandbox_id = sb.sandbox_id
        assert _state(sandbox_id) == "in_use"
    assert sb.released
    wait_for(lambda: _state(sandbox_id) == "deleted", what="the released sandbox to be deleted")


def test_leaving_the_block_by_an_exception_still_releases_the_sandbox(client):
    job = client.job(name="boom", egress="allow")
    with pytest.raises(RuntimeError, match="agent crashed"):
        with job.acquire(image="sandman/empty", spec=SPEC, timeout_s=60) as sb:
            sandbox_id = sb.sandbox_id
            raise RuntimeError("agent crashed")
    assert sb.released
    assert Sandbox.objects.get(pk=sandbox_id).released_at is not None
    wait_for(lambda: _state(sandbox_id) == "deleted", what="the sandbox to be deleted")


def test_rest_errors_come_back_as_sandman_client_errors_with_status_and_code(client, live_server):
    with pytest.raises(SandmanClientError) as missing:
        client.get_job(987654)
    assert (missing.value.status, missing.value.code) == (404, "not_found")
    with pytest.raises(SandmanClientError) as bad:
        client.job(name="x", egress="sometimes")
    assert (bad.value.status, bad.value.code) == (400, "invalid")
    assert "egress" in bad.value.detail
    job = client.job(name="y", egress="allow")
    with pytest.raises(SandmanClientError) as spec:
        job.acquire(image="sandman/empty", spec={"cpu": "2 cores", "memory": "1Gi"})
    assert (spec.value.status, spec.value.code) == (400, "invalid")
    with pytest.raises(SandmanClientError) as auth:
        Client(live_server.url, "not-a-token").jobs()
    assert (auth.value.status, auth.value.code) == (401, "authentication_failed")
    assert Sandbox.objects.count() == 0


def test_prewarm_and_drain_through_the_client(client):
    job = client.job(name="warmed", egress="allow")
    job.prewarm([{"image": "sandman/empty", "spec": SPEC, "count": 2}])
    wait_for(lambda: job.refresh().counts["warm"] >= 2, what="two warm sandboxes")
    with job.acquire(image="sandman/empty", spec=SPEC, timeout_s=60) as sb:
        assert sb.source == "warm"
    assert [row["id"] for row in job.sandboxes(state="ready")]
    job.drain()
    wait_for(lambda: Job.objects.get(pk=job.id).state == "drained", what="the drain to finish")
    assert set(Sandbox.objects.filter(job_id=job.id).values_list("state", flat=True)) == {"deleted"}


def test_a_jobs_startup_script_runs_first_in_every_session_of_its_sandboxes(client):
    """Issue 14: ``startup_script`` is stored with the job, passed to each sandbox's
    execd, and run first in its default session and in every named one."""
    script = "export ACTIVATED=conda-env\n"
    job = client.job(name="client-startup", egress="allow", startup_script=script)
    assert job.data["startup_script"] == script
    assert client.get_job(job.id).data["startup_script"] == script
    with job.acquire(image="sandman/empty", spec=SPEC, timeout_s=60) as sb:
        assert sb.run("echo $ACTIVATED").output == "conda-env\n"
        tests = sb.create_session("tests", startup="export OWN=$ACTIVATED-own")
        assert tests.run("echo $OWN").output == "conda-env-own\n"
    with pytest.raises(SandmanClientError) as bad:
        client.job(name="bad-startup", egress="allow", startup_script=7)
    assert bad.value.status == 400
