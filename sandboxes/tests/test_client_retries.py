"""Safe retries, threads, reclaim and renew through the trainer client against a LIVE server
(issue 14, item 7): the real controller, local provider and execd over HTTP.

A proxy between the client and the server cuts the client's socket after the request
reached the server (the server still answers, into the void): without an
``Idempotency-Key`` the caller could not know whether a sandbox was handed out.
"""

from __future__ import annotations

import datetime as dt
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
from django.utils import timezone

from sandboxes.client import Client, SandboxReclaimed, SandmanClientError
from sandboxes.models import IdempotentCall, Sandbox
from sandboxes.tests.api_support import api, make_job, make_user

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]

SPEC = {"cpu": "500m", "memory": "256Mi"}


class CuttingProxy:
    """Forwards one request per connection; for the first ``cuts`` requests whose path
    contains ``target`` it waits for the server's answer, drops it and closes the client's
    socket (the request ran; its answer is lost)."""

    def __init__(self, upstream: str, target: str, cuts: int) -> None:
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.target = target.encode()
        self.cuts = cuts
        self.cut = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._relay, args=(conn,), daemon=True).start()

    def _relay(self, conn: socket.socket) -> None:
        with conn, socket.create_connection(self.upstream) as up:
            reader, upreader = conn.makefile("rb"), up.makefile("rb")
            while True:
                request = _read_message(reader)
                if request is None:
                    return
                up.sendall(request)
                answer = _read_message(upreader)
                if answer is None:
                    return
                if self.target in request.split(b"\r\n", 1)[0] and self.cut < self.cuts:
                    self.cut += 1
                    return  # the answer is dropped and the client's socket closed
                conn.sendall(answer)

    def close(self) -> None:
        self.listener.close()


def _read_message(f: Any) -> bytes | None:
    """One HTTP/1.1 message with a Content-Length body (all this test's server sends)."""
    head = b""
    while not head.endswith(b"\r\n\r\n"):
        line = f.readline()
        if not line:
            return None
        head += line
    length = 0
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    return head + (f.read(length) if length else b"")


@pytest.fixture
def user_token() -> tuple[Any, str]:
    return make_user("retry-user")


@pytest.fixture
def token(user_token: tuple[Any, str]) -> str:
    return user_token[1]


@pytest.fixture
def proxy_for(live_server) -> Iterator[Any]:
    made: list[CuttingProxy] = []

    def make(target: str, cuts: int = 1) -> CuttingProxy:
        made.append(CuttingProxy(live_server.url, target, cuts))
        return made[-1]

    yield make
    for p in made:
        p.close()


def test_an_acquire_whose_answer_was_cut_is_retried_and_gets_the_same_sandbox(
    controller, live_server, token, proxy_for
):
    proxy = proxy_for("/acquire/")
    with Client(proxy.url, token) as client:
        job = client.job(name="cut-acquire", egress="deny")
        with job.acquire(image="sandman/empty", spec=SPEC, timeout_s=60) as sb:
            assert proxy.cut == 1  # the first answer was lost on the way
            assert sb.run("echo once").output == "once\n"
            rows = Sandbox.objects.filter(job_id=job.id)
            assert [r.pk for r in rows.filter(acquired_at__isnull=False)] == [sb.sandbox_id]
            assert IdempotentCall.objects.filter(route="acquire", scope=job.id).count() == 1
            assert "token" not in IdempotentCall.objects.get(scope=job.id).answer


def test_a_release_whose_answer_was_cut_is_retried_as_a_no_op(
    controller, live_server, token, proxy_for
):
    proxy = proxy_for("/release/")
    with Client(proxy.url, token) as client:
        job = client.job(name="cut-release", egress="deny")
        sb = job.acquire(image="sandman/empty", spec=SPEC, timeout_s=60)
        sb.release()  # the first answer is lost; the retry with the same key is replayed
        assert proxy.cut == 1 and sb.released
        sb.release()  # and a second release() does nothing
        assert Sandbox.objects.get(pk=sb.sandbox_id).released_at is not None


def test_the_same_key_twice_answers_the_same_sandbox_and_a_bad_key_is_refused(
    controller, user_token
):
    user, token = user_token
    rest = api(token)
    job = make_job(user, name="keyed")
    body = {"image": "sandman/empty", "spec": SPEC}
    url = f"/api/v1/jobs/{job.pk}/acquire/"
    first = rest.post(url, body, format="json", HTTP_IDEMPOTENCY_KEY="k-1")
    again = rest.post(url, body, format="json", HTTP_IDEMPOTENCY_KEY="k-1")
    assert first.status_code == again.status_code == 200, first.content
    assert first.json() == again.json()  # the same sandbox, token included
    other = rest.post(url, body, format="json", HTTP_IDEMPOTENCY_KEY="k-2")
    assert other.json()["sandbox_id"] != first.json()["sandbox_id"]
    bad = rest.post(url, body, format="json", HTTP_IDEMPOTENCY_KEY="has space")
    assert bad.status_code == 400 and bad.json()["error"] == "invalid"
    assert Sandbox.objects.filter(job=job, acquired_at__isnull=False).count() == 2
    release = f"/api/v1/sandboxes/{first.json()['sandbox_id']}/release/"
    assert rest.post(release, {}, format="json", HTTP_IDEMPOTENCY_KEY="r").status_code == 200
    assert rest.post(release, {}, format="json", HTTP_IDEMPOTENCY_KEY="r").status_code == 200
    assert rest.post(release, {}, format="json").json()["error"] == "already_released"


def _exists(sb: Any, path: str) -> bool:
    try:
        sb.read_bytes(path)
    except SandmanClientError as e:
        if e.status == 404:
            return False
        raise
    return True


def test_two_threads_on_one_sandbox_get_busy_not_a_broken_connection(
    controller, live_server, token
):
    """Trial: two threads on one ``Sandbox`` broke its shared connection."""
    with Client(live_server.url, token) as client:
        job = client.job(name="threads", egress="deny")
        with job.acquire(image="sandman/empty", spec=SPEC, timeout_s=60) as sb:
            started = threading.Event()
            results: list[Any] = []

            def long_command() -> None:
                started.set()
                results.append(
                    sb.run("touch running; until [ -e gate ]; do sleep 0.01; done; echo done")
                )

            worker = threading.Thread(target=long_command)
            worker.start()
            started.wait(10)
            # Gate on the command really running (its marker file, read over the file route
            # on this thread's own connection), so this thread's commands meet it in execd
            # instead of racing it for the shell.
            deadline = time.monotonic() + 30
            while not _exists(sb, "running"):
                assert time.monotonic() < deadline and worker.is_alive(), results
            # The other thread gets execd's 409 busy, and file routes keep working meanwhile.
            with pytest.raises(SandmanClientError) as busy:
                sb.run("true")
            assert (busy.value.status, busy.value.code) == (409, "busy")
            sb.write("gate", "")
            worker.join(30)
            assert results[0].output == "done\n"
            assert sb.run("echo after").output == "after\n"


def test_a_sandbox_reclaimed_at_its_lifetime_raises_sandbox_reclaimed(
    controller, live_server, token
):
    """Trial: a reclaimed sandbox looked like ``connection_failed: Connection refused``
    and a later ``release()`` raised 409."""
    with Client(live_server.url, token) as client:
        job = client.job(name="reclaim", egress="deny", max_lifetime_s=1)
        sb = job.acquire(image="sandman/empty", spec=SPEC, timeout_s=60)
        assert sb.run("echo up").exit_code == 0
        Sandbox.objects.filter(pk=sb.sandbox_id).update(
            acquired_at=timezone.now() - dt.timedelta(seconds=5)
        )
        assert controller.run_maintenance()["reclaimed"] == 1
        with pytest.raises(SandboxReclaimed) as reclaimed:
            sb.run("echo gone")
        assert reclaimed.value.reason == "max_lifetime"
        sb.release()  # a no-op, not a 409
        assert sb.released


def test_renew_keeps_a_sandbox_past_its_jobs_lifetime(controller, live_server, token):
    with Client(live_server.url, token) as client:
        job = client.job(name="renew", egress="deny", max_lifetime_s=60)
        with job.acquire(image="sandman/empty", spec=SPEC, timeout_s=60) as sb:
            Sandbox.objects.filter(pk=sb.sandbox_id).update(
                acquired_at=timezone.now() - dt.timedelta(seconds=50)
            )
            expires = dt.datetime.fromisoformat(sb.renew(600))
            assert expires > timezone.now() + dt.timedelta(seconds=590)
            Sandbox.objects.filter(pk=sb.sandbox_id).update(
                acquired_at=timezone.now() - dt.timedelta(seconds=120)
            )
            assert controller.run_maintenance()["reclaimed"] == 0
            assert sb.run("echo still").output == "still\n"
            with pytest.raises(SandmanClientError) as bad:
                sb.renew(0)
            assert bad.value.status == 400
        with pytest.raises(SandmanClientError) as done:
            sb.renew(10)
        assert (done.value.status, done.value.code) == (409, "invalid_transition")
