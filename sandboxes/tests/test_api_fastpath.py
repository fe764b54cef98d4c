"""The ASGI fast path of acquire/release: known callers skip Django, everyone else does not.

Requests go through ``hot_routes`` wrapped around Django's real ASGI handler (the one the
service runs), with the real controller, local provider and execd. The wrapped app
records whether Django was reached, so each test can tell which side answered, and
compares the fast path's answers (status, body, headers) with the DRF views' own.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import pytest_asyncio
from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIHandler
from django.db import connections
from django.test import override_settings

from sandboxes.apis import access
from sandboxes.apis.fastpath import hot_routes
from sandboxes.tests.api_support import make_user

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

SPEC = {"cpu": "500m", "memory": "256Mi"}


class Recorder:
    """Django's ASGI handler, counting the requests that reached it."""

    def __init__(self) -> None:
        self.django = ASGIHandler()
        self.paths: list[str] = []

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        self.paths.append(scope["path"])
        await self.django(scope, receive, send)


async def post(
    app: Any,
    path: str,
    token: str,
    body: Any = None,
    *,
    raw: bytes | None = None,
    host: str = "testserver",
    leave: bool = False,
    extra: list[tuple[bytes, bytes]] = (),
):
    content = raw if raw is not None else (b"" if body is None else json.dumps(body).encode())
    headers = [(b"host", host.encode()), (b"authorization", f"Token {token}".encode()), *extra]
    if content:
        headers.append((b"content-type", b"application/json"))
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [*headers, (b"content-length", str(len(content)).encode())],
        "client": ("127.0.0.1", 1),
        "server": ("testserver", 80),
    }
    inbox = [{"type": "http.request", "body": content, "more_body": False}]
    if leave:
        inbox.append({"type": "http.disconnect"})  # the client goes away at once
    sent: list[dict] = []

    async def receive() -> dict:
        if inbox:
            return inbox.pop(0)
        await asyncio.Event().wait()  # the client stays connected (cancelled when answered)
        raise AssertionError("unreachable")

    async def send(message: dict) -> None:
        sent.append(message)

    await app(scope, receive, send)
    if leave:
        return sent
    start = sent[0]
    data = b"".join(m.get("body", b"") for m in sent[1:])
    headers_out = {k.decode().lower(): v.decode() for k, v in start["headers"]}
    is_json = headers_out.get("content-type") == "application/json"
    return start["status"], headers_out, json.loads(data) if is_json else data


@pytest_asyncio.fixture(autouse=True)
async def close_thread_connections():
    """Calls made with ``sync_to_async`` from this test's loop run on asgiref's shared
    thread; its connection is closed here, or PostgreSQL could not drop the test database."""
    yield
    await sync_to_async(connections.close_all)()


@pytest.fixture(autouse=True)
def token_known_across_a_create(settings):
    """These tests ask which side answered; a token read once must stay known while a
    sandbox is created on a loaded machine, longer than the 1 s revocation window
    (that window is tested in ``test_api_access``)."""
    settings.SANDMAN_API_TOKEN_TTL_S = 600.0


@pytest.fixture
def trainer(controller) -> dict[str, Any]:
    from sandboxes.services.jobs import job_create

    access.clear()
    user, token = make_user("trainer")
    job = job_create(owner=user, name="fast", egress="allow", now=_now())
    return {"user": user, "token": token, "job_id": job.pk}


async def _primed(trainer: dict[str, Any]) -> tuple[Recorder, Any, str, dict[str, Any], Any]:
    """Django behind the fast path, the job's acquire path, a good body and the answer of
    one fast acquire that taught the fast path the token and the job's owner."""
    app = Recorder()
    fast = hot_routes(app)
    acquire = f"/api/v1/jobs/{trainer['job_id']}/acquire/"
    good = {"image": "sandman/empty", "spec": SPEC, "timeout_s": 60}
    status, _, first = await post(fast, acquire, trainer["token"], good)
    assert status == 200, first
    return app, fast, acquire, good, first


def _now():
    from django.utils import timezone

    return timezone.now()


async def test_a_known_callers_acquire_and_release_skip_django_with_the_views_answers(trainer):
    app = Recorder()
    fast = hot_routes(app)
    acquire = f"/api/v1/jobs/{trainer['job_id']}/acquire/"
    body = {"image": "sandman/empty", "spec": SPEC, "timeout_s": 60}
    status, django_headers, keyed_answer = await post(app, acquire, trainer["token"], body)
    assert status == 200, keyed_answer  # the view's own answer, for its headers
    assert app.paths == [acquire]
    access.clear()  # the token, the job's owner and the sandbox are unknown again
    status, _, first = await post(fast, acquire, trainer["token"], body)
    assert status == 200, first
    assert app.paths == [acquire]  # read the token and the job's owner, then the fast path
    release = f"/api/v1/sandboxes/{first['sandbox_id']}/release/"
    status, fast_headers, released = await post(fast, release, trainer["token"])
    assert (status, released) == (200, {"sandbox_id": first["sandbox_id"], "released": True})
    status, _, second = await post(fast, acquire, trainer["token"], body)
    assert status == 200, second
    assert set(second) == set(first) >= {"sandbox_id", "address", "token", "source", "wait_ms"}
    assert second["sandbox_id"] != first["sandbox_id"]
    # The view's sandbox, unknown to this process's map: its job from the controller.
    access.forget_sandbox(keyed_answer["sandbox_id"])
    other = f"/api/v1/sandboxes/{keyed_answer['sandbox_id']}/release/"
    assert (await post(fast, other, trainer["token"]))[0] == 200
    assert app.paths == [acquire]  # every call after the view's: the fast path alone
    assert {k: v for k, v in fast_headers.items() if k != "content-length"} == {
        k: v for k, v in django_headers.items() if k != "content-length"
    }
    state = await sync_to_async(_state)(second["sandbox_id"])
    assert state == "in_use"


async def test_what_the_fast_path_cannot_judge_from_memory_goes_to_django_unchanged(trainer):
    app, fast, acquire, good, first = await _primed(trainer)
    cases = [
        ({"image": "sandman/empty", "spec": {"cpu": "lots", "memory": "1Gi"}}, None, 400),
        (None, b'{"image": ', 400),  # malformed JSON
        (None, b'{"image": "sandman/empty", "spec": {"cpu": NaN, "memory": "1Gi"}}', 400),
        ({"image": "no/such-image", "spec": SPEC}, None, 400),
    ]
    for body, raw, expected in cases:
        before = len(app.paths)
        status, _, answer = await post(fast, acquire, trainer["token"], body, raw=raw)
        assert status == expected, answer
        assert set(answer) >= {"error", "detail"}
        assert len(app.paths) == before + 1  # Django answered, with the body replayed
    other_job = f"/api/v1/jobs/{trainer['job_id'] + 1000}/acquire/"
    status, _, answer = await post(fast, other_job, trainer["token"], good)
    assert (status, answer["error"]) == (404, "not_found")
    status, _, answer = await post(fast, acquire, "0" * 40, good)
    assert (status, answer["error"]) == (401, "authentication_failed")
    before = len(app.paths)
    with override_settings(ALLOWED_HOSTS=["sandman.example"]):
        status, _, _ = await post(fast, acquire, trainer["token"], good, host="testserver")
    assert status == 400 and len(app.paths) == before + 1  # Django's DisallowedHost answer


async def test_a_body_validated_before_is_still_refused_once_its_image_is_gone(trainer, tmp_path):
    """The fast path remembers what a body validated to, but the image's check with the
    backend runs on every call: a template removed since is the view's 400."""
    import shutil

    app, fast, acquire, _, _ = await _primed(trainer)
    template = tmp_path / "template"
    template.mkdir()
    (template / "README").write_text("a task\n")
    body = {"image": f"file://{template}", "spec": SPEC, "timeout_s": 60}
    before = len(app.paths)
    for _ in range(2):  # validated, then remembered
        status, _, answer = await post(fast, acquire, trainer["token"], body)
        assert status == 200, answer
    assert len(app.paths) == before  # both answered by the fast path
    shutil.rmtree(template)

    status, _, refused = await post(fast, acquire, trainer["token"], body)

    assert (status, refused["error"]) == (400, "unknown_image")
    assert len(app.paths) == before + 1  # the view answered, as it answers a new body


async def test_a_controller_refusal_on_the_fast_path_is_the_views_json_error(trainer):
    app, fast, acquire, good, first = await _primed(trainer)
    drain = f"/api/v1/jobs/{trainer['job_id']}/drain/"
    status, _, _ = await post(app, drain, trainer["token"], {})
    assert status == 202
    before = len(app.paths)
    fast_status, fast_headers, fast_answer = await post(fast, acquire, trainer["token"], good)
    assert len(app.paths) == before  # answered by the fast path
    view_status, view_headers, view_answer = await post(app, acquire, trainer["token"], good)
    assert fast_status == view_status == 409
    assert fast_answer == view_answer and fast_answer["error"] == "job_not_active"
    assert fast_headers["content-type"] == view_headers["content-type"] == "application/json"


def _state(sandbox_id: int) -> str:
    from sandboxes.models import Sandbox

    return Sandbox.objects.get(pk=sandbox_id).state


async def test_a_client_that_leaves_during_a_fast_path_acquire_cancels_it_and_gets_nothing(
    trainer, controller
):
    """As Django cancels a view: the acquisition ends ``cancelled``, no pod is in use."""
    app, fast, acquire, good, first = await _primed(trainer)
    status, _, _ = await post(
        fast, f"/api/v1/sandboxes/{first['sandbox_id']}/release/", trainer["token"]
    )
    assert status == 200
    before = len(app.paths)
    sent = await post(fast, acquire, trainer["token"], good, leave=True)  # no warm pod: creates
    assert sent == [] and len(app.paths) == before
    await sync_to_async(controller.wait_idle)(60)
    outcomes = await sync_to_async(_outcomes)(trainer["job_id"])
    assert outcomes == ["ok", "cancelled"]
    in_use = await sync_to_async(_in_use)(trainer["job_id"])
    assert in_use == 0


def _outcomes(job_id: int) -> list[str]:
    from sandboxes.models import Acquisition

    return list(
        Acquisition.objects.filter(job_id=job_id).order_by("pk").values_list("outcome", flat=True)
    )


def _in_use(job_id: int) -> int:
    from sandboxes.models import Sandbox

    return Sandbox.objects.filter(job_id=job_id, state="in_use").count()


async def test_a_split_web_workers_fast_path_503_says_when_to_retry_as_the_view_does(
    trainer, settings, tmp_path
):
    """Split processes with the controller process gone (restarting, or stopping): the fast
    path answers the view's ``503 controller_unavailable`` WITH its ``Retry-After``."""
    app, fast, acquire, good, first = await _primed(trainer)
    settings.SANDMAN_CONTROLLER_SOCKET = str(tmp_path / "nobody-listens.sock")
    before = len(app.paths)
    fast_status, fast_headers, fast_answer = await post(fast, acquire, trainer["token"], good)
    assert len(app.paths) == before  # the fast path answered
    view_status, view_headers, view_answer = await post(app, acquire, trainer["token"], good)
    assert fast_status == view_status == 503
    assert fast_answer == view_answer and fast_answer["error"] == "controller_unavailable"
    assert fast_headers["retry-after"] == view_headers["retry-after"] == "1"
    assert fast_headers["content-type"] == "application/json"


def _acquisitions(job_id: int) -> list[tuple[str, int | None, str]]:
    from sandboxes.models import Acquisition

    rows = Acquisition.objects.filter(job_id=job_id).order_by("pk")
    return list(rows.values_list("outcome", "sandbox_id", "idempotency_key"))


async def test_keyed_calls_take_the_fast_path_and_run_once_per_key_as_the_views_do(trainer):
    """The trainer client sends an ``Idempotency-Key`` with every call: those calls skip
    Django too, with the views' record-and-replay (a retried acquire gets the same
    sandbox, never a second; a retried release is a no-op); the view replays what the
    fast path recorded; a malformed key is the view's 400."""
    app = Recorder()
    fast = hot_routes(app)
    acquire = f"/api/v1/jobs/{trainer['job_id']}/acquire/"
    body = {"image": "sandman/empty", "spec": SPEC, "timeout_s": 60}
    keyed = [(b"idempotency-key", b"client-acquire-1")]
    status, _, first = await post(fast, acquire, trainer["token"], body, extra=keyed)
    assert status == 200, first
    status, _, retried = await post(fast, acquire, trainer["token"], body, extra=keyed)
    assert status == 200 and app.paths == []  # both answered by the fast path
    assert retried["sandbox_id"] == first["sandbox_id"]
    status, _, by_view = await post(app, acquire, trainer["token"], body, extra=keyed)
    assert status == 200 and by_view["sandbox_id"] == first["sandbox_id"]  # one record
    rows = await sync_to_async(_acquisitions)(trainer["job_id"])
    assert rows == [("ok", first["sandbox_id"], "client-acquire-1")]  # one hand-out

    release = f"/api/v1/sandboxes/{first['sandbox_id']}/release/"
    key = [(b"idempotency-key", b"client-release-1")]
    for _ in range(2):
        status, _, released = await post(fast, release, trainer["token"], extra=key)
        assert (status, released) == (200, {"sandbox_id": first["sandbox_id"], "released": True})
    # The first release by the fast path; its retry by the view, which replays the record
    # (a released sandbox is no longer in the books the fast path vouches for callers from).
    assert app.paths == [acquire, release]
    unkeyed = await post(fast, release, trainer["token"])  # no key: a second release
    assert unkeyed[0] == 409 and unkeyed[2]["error"] == "already_released", unkeyed

    bad = [(b"idempotency-key", b"has space")]
    status, _, refused = await post(fast, acquire, trainer["token"], body, extra=bad)
    assert (status, refused["error"]) == (400, "invalid")
    assert app.paths == [acquire, release, release, acquire]  # Django gave the 400
    assert len(await sync_to_async(_acquisitions)(trainer["job_id"])) == 1


async def test_a_database_lost_under_a_keyed_fast_path_call_is_the_views_503(trainer, monkeypatch):
    """A keyed call reads its record on the fast path; a database that drops there gets
    the view's ``503 database_unavailable`` with ``Retry-After``, never a 500, and nothing
    is handed out."""
    from django.db import OperationalError

    from sandboxes import selectors

    app, fast, acquire, good, first = await _primed(trainer)

    def lost(**_: Any) -> None:
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(selectors, "idempotent_answer", lost)
    keyed = [(b"idempotency-key", b"lost-1")]
    before = len(app.paths)
    fast_status, fast_headers, fast_answer = await post(
        fast, acquire, trainer["token"], good, extra=keyed
    )
    assert len(app.paths) == before  # the fast path answered
    view_status, view_headers, view_answer = await post(
        app, acquire, trainer["token"], good, extra=keyed
    )
    assert fast_status == view_status == 503, (fast_answer, view_answer)
    assert fast_answer == view_answer and fast_answer["error"] == "database_unavailable"
    assert fast_headers["retry-after"] == view_headers["retry-after"] == "1"
    assert len(await sync_to_async(_acquisitions)(trainer["job_id"])) == 1  # the primer's
