"""An ASGI fast path for the two hot routes: a warm acquire and a release by a known caller.

Under load a trainer's acquire/release pair is mostly Django overhead, not pool work: the
ASGI handler starts a thread per request, seven middlewares hop to it and back, signals
hop twice more. ``hot_routes(app)`` wraps the Django ASGI app and answers, without
Django's handler, exactly the requests whose every check can be made from memory:

* ``POST /api/v1/jobs/<id>/acquire/`` and ``POST /api/v1/sandboxes/<id>/release/``,
* with ``Authorization: Token <key>`` of a token ``access`` knows (or has just read),
* on a job (or a sandbox this process handed out) the caller may see,
* with a JSON object body that the view's own ``InputSerializer`` accepts (and, for an
  acquire, no ``base_commit``: resolving one runs git), and no ``Idempotency-Key`` or a
  well-formed one (the trainer client sends one with every call): a keyed call runs
  through the views' own ``acquire_answer``/``release_answer``, so it is recorded and
  replayed exactly as the view does (``sandboxes.apis.idempotency``: once per key, a
  retry waits for or replays the first answer, a restart-cut hand-out is recovered),
* within the token's request rate (``sandman_site.ratelimit``; past it, the view's
  throttle answers the 429),
* to a controller that runs (a standby's refusal, with its ``Retry-After``, is the view's).

Invariants a reader must not break:
* Anything else, and any surprise before the controller is called, FALLS THROUGH to
  Django with the body replayed byte for byte: every refusal (401, 404, 400, 415, 405)
  is the DRF view's own answer, so the error contract is the views' by construction.
* Once the controller is called, its ``SandmanError`` (or a lost database: a keyed call
  reads and writes its record here) leaves through
  ``sandman_site.api_errors.exception_handler`` and DRF's ``JSONRenderer``: the same
  ``{"error", "detail"}`` body and status the view would give, with the view's headers
  and the handler's own (a ``503 controller_unavailable``'s ``Retry-After``: split
  processes whose controller process is restarting or stopping).
* A client that disconnects cancels the controller call, as Django cancels a view.
* What Django's middleware would do is done or declined: a Host outside ALLOWED_HOSTS
  goes to Django (its 400); the security headers come from the same settings; with an
  HTTPS redirect or HSTS configured there is no fast path at all.
* The route decides from ``access``'s maps only. A miss is filled first (``_prime``) by
  the reads the views themselves make (the token and its user, the job's owner; in a
  request thread) or, for a sandbox another web worker handed out, by the controller's
  books; a failed fill changes nothing and Django answers. So a token read more than
  ``token_ttl_s()`` ago costs one token read here, not a trip through Django, and a
  revoked token still stops working within that TTL.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from typing import Any

from asgiref.sync import sync_to_async
from django.db import close_old_connections
from rest_framework.renderers import JSONRenderer

from sandboxes.apis import access, idempotency
from sandman_site.dbguard import OUTAGE_ERRORS
from sandman_site.errors import SandmanError
from sandman_site.parsers import parse_json_bytes
from sandman_site.ratelimit import hot_route_buckets

log = logging.getLogger(__name__)
request_log = logging.getLogger("django.request")

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
Call = Callable[[], Awaitable[tuple[int, Any]]]

_ACQUIRE = re.compile(r"^/api/v1/jobs/(\d+)/acquire/$")
_RELEASE = re.compile(r"^/api/v1/sandboxes/(\d+)/release/$")
_MAX_BODY = 64 * 1024  # a hot-route body is a few hundred bytes; bigger goes to Django


def _view_headers() -> list[tuple[bytes, bytes]] | None:
    """The headers the DRF view's answer carries (its own and the security middlewares'),
    from the settings; None when Django would do more than add headers (an HTTPS
    redirect, HSTS): then every request goes to Django."""
    from django.conf import settings

    if settings.SECURE_SSL_REDIRECT or settings.SECURE_HSTS_SECONDS:
        return None
    middleware = set(settings.MIDDLEWARE)
    headers = [
        (b"content-type", b"application/json"),
        (b"vary", b"Accept"),
        (b"allow", b"POST, OPTIONS"),
    ]
    if "django.middleware.clickjacking.XFrameOptionsMiddleware" in middleware:
        headers.append((b"x-frame-options", settings.X_FRAME_OPTIONS.upper().encode()))
    if "django.middleware.security.SecurityMiddleware" in middleware:
        if settings.SECURE_CONTENT_TYPE_NOSNIFF:
            headers.append((b"x-content-type-options", b"nosniff"))
        if settings.SECURE_REFERRER_POLICY:
            policy = settings.SECURE_REFERRER_POLICY
            if not isinstance(policy, str):
                policy = ",".join(policy)
            headers.append((b"referrer-policy", policy.encode()))
        if settings.SECURE_CROSS_ORIGIN_OPENER_POLICY:
            headers.append(
                (b"cross-origin-opener-policy", settings.SECURE_CROSS_ORIGIN_OPENER_POLICY.encode())
            )
    return headers


def hot_routes(app: Callable[..., Awaitable[None]]) -> Callable[..., Awaitable[None]]:
    """Wrap an ASGI app (Django's): the hot routes of known callers skip it."""
    view_headers = _view_headers()
    if view_headers is None:
        return app

    async def asgi(scope: Scope, receive: Receive, send: Send) -> None:
        route = _route(scope)
        if route is None or not _host_allowed(scope):
            await app(scope, receive, send)
            return
        messages, body, complete = await _read_body(receive)
        replay = _replayed(messages, receive)
        call = None
        if complete:
            await _prime(scope)
            try:
                call = route(scope, body)
            except Exception:  # a surprise before any effect: Django answers instead
                log.debug("fast path declined %s", scope.get("path"), exc_info=True)
        if call is None:
            await app(scope, replay, send)
            return
        outcome = await _until_disconnect(call, receive)
        if outcome is None:
            return  # the client left; the controller call was cancelled
        status, data, extra = outcome
        if status >= 500:
            request_log.error("%s: %s", HTTPStatus(status).phrase, scope.get("path"))
        await _send_json(send, status, data, [*view_headers, *extra])

    return asgi


def _host_allowed(scope: Scope) -> bool:
    """ALLOWED_HOSTS, as Django's ``request.get_host()`` judges it (a bad Host: Django)."""
    from django.conf import settings
    from django.http.request import split_domain_port, validate_host

    host = dict(scope.get("headers") or []).get(b"host", b"").decode("latin-1")
    domain, _ = split_domain_port(host)
    allowed = settings.ALLOWED_HOSTS
    if settings.DEBUG and not allowed:
        allowed = [".localhost", "127.0.0.1", "[::1]"]
    return bool(domain) and validate_host(domain, allowed)


def _route(scope: Scope) -> Callable[[Scope, bytes], Call | None] | None:
    if scope.get("type") != "http" or scope.get("method") != "POST":
        return None
    path = scope.get("path", "")
    if _ACQUIRE.match(path):
        return _acquire
    if _RELEASE.match(path):
        return _release
    return None


# --- the two routes: checks from memory, then one controller call ---------------------------


async def _prime(scope: Scope) -> None:
    """Fill ``access``'s maps on a miss, before the route decides from them: the token (and
    its user) and the job's owner by the same reads the views make (a request thread), and
    a sandbox's job from the controller's books (a sandbox handed out by another web
    worker). Any failure leaves the maps as they were, and the route then sends the
    request to Django, whose view gives its own answer (401, 404, 503)."""
    headers = dict(scope.get("headers") or [])
    parts = headers.get(b"authorization", b"").split()
    if len(parts) != 2 or parts[0].lower() != b"token":
        return
    key = parts[1].decode("ascii", "replace")
    path = scope.get("path", "")
    try:
        user = access.cached_token_user(key)
        if user is None:
            user, _ = await access.token_user(key)
        acquire = _ACQUIRE.match(path)
        if acquire is not None:
            job_id = int(acquire.group(1))
            if access.job_visible_cached(user=user, job_id=job_id) is None:
                await access.check_job(user=user, job_id=job_id)
            return
        release = _RELEASE.match(path)
        if release is not None:
            sandbox_id = int(release.group(1))
            if access.sandbox_visible_cached(user=user, sandbox_id=sandbox_id) is None:
                from sandboxes.apis.common import controller

                owner_job = await controller().ajob_of_in_use(sandbox_id=sandbox_id)
                if owner_job is not None:
                    if access.job_visible_cached(user=user, job_id=owner_job) is None:
                        await access.check_job(user=user, job_id=owner_job)
                    access.remember_sandbox(sandbox_id=sandbox_id, job_id=owner_job)
    except Exception:  # refused or unreachable: Django answers, from its own reads
        log.debug("fast path could not prime %s", path, exc_info=True)
        await sync_to_async(close_old_connections, thread_sensitive=True)()


def _caller(scope: Scope, body: bytes) -> tuple[Any, Any, str | None] | None:
    """(user, JSON object body, Idempotency-Key or None) for a known token, a JSON object
    and a well-formed key (a malformed one is the view's 400); else None."""
    headers = dict(scope.get("headers") or [])
    key: str | None = None
    if b"idempotency-key" in headers:
        key = headers[b"idempotency-key"].decode("latin-1")
        if not idempotency.valid_key(key):
            return None
    parts = headers.get(b"authorization", b"").split()
    if len(parts) != 2 or parts[0].lower() != b"token":
        return None
    user = access.cached_token_user(parts[1].decode("ascii", "replace"))
    if user is None:
        return None
    if not body:
        return user, {}, key
    content_type = headers.get(b"content-type", b"").split(b";")[0].strip().lower()
    if content_type != b"application/json":
        return None
    # The API's own parser (bounds on depth and numbers); a refusal raises, and Django
    # then gives the view's answer.
    data = parse_json_bytes(body)
    return (user, data, key) if isinstance(data, dict) else None


def _admitted(scope: Scope) -> bool:
    """Spend one of the token's hot-route requests; False past its rate (the view's
    throttle then answers, from the same buckets)."""
    headers = dict(scope.get("headers") or [])
    key = headers.get(b"authorization", b"").split()[1].decode("ascii", "replace")
    return hot_route_buckets().take(key) == 0.0


def _acquire(scope: Scope, body: bytes) -> Call | None:
    from sandboxes.apis.common import controller
    from sandboxes.apis.jobs import JobAcquireApi, acquire_answer

    known = _caller(scope, body)
    if known is None:
        return None
    user, data, key = known
    job_id = int(_ACQUIRE.match(scope["path"]).group(1))  # type: ignore[union-attr]
    if access.job_visible_cached(user=user, job_id=job_id) is not True:
        return None
    if data.get("base_commit"):
        return None
    fields = _valid(JobAcquireApi.InputSerializer, body, data)
    if fields is None:
        return None
    ctl = controller()
    if not ctl.started or not _admitted(scope):
        return None

    async def call() -> tuple[int, Any]:
        return 200, await acquire_answer(job_id=job_id, user_id=user.pk, key=key, fields=fields)

    return call


def _release(scope: Scope, body: bytes) -> Call | None:
    from sandboxes.apis.common import controller
    from sandboxes.apis.sandboxes import SandboxReleaseApi, release_answer

    known = _caller(scope, body)
    if known is None:
        return None
    user, data, key = known
    sandbox_id = int(_RELEASE.match(scope["path"]).group(1))  # type: ignore[union-attr]
    if access.sandbox_visible_cached(user=user, sandbox_id=sandbox_id) is not True:
        return None
    validated = _valid(SandboxReleaseApi.InputSerializer, body, data)
    if validated is None:
        return None
    ctl = controller()
    if not ctl.started or not _admitted(scope):
        return None
    outcome = validated.get("outcome") or {}

    async def call() -> tuple[int, Any]:
        return 200, await release_answer(sandbox_id=sandbox_id, key=key, outcome=outcome)

    return call


_VALID_MAX = 1024  # distinct bodies remembered per process (a job sends a few)
_valid_bodies: dict[tuple[type, bytes], dict[str, Any]] = {}


def _valid(serializer: type, body: bytes, data: dict[str, Any]) -> dict[str, Any] | None:
    """The view's ``InputSerializer``'s validated data for ``data`` (parsed from
    ``body``), or None when it refuses. A trainer sends the same few bodies again and
    again, so what a body validated to is remembered by its bytes: a body's validation
    reads nothing but the body, except the image's check with the backend, which runs
    every time (a template removed since answers as the view does). Each caller gets a
    copy (an acquire's data is flat, a release's ``outcome`` one level deep)."""
    from sandboxes.apis.common import check_image

    found = _valid_bodies.get((serializer, body))
    if found is None:
        checked = serializer(data=data)
        if not checked.is_valid():
            return None
        found = dict(checked.validated_data)
        if len(_valid_bodies) >= _VALID_MAX:
            _valid_bodies.clear()
        _valid_bodies[(serializer, body)] = found
    elif "image" in found:
        check_image(found["image"], found.get("base_commit"))
    return {k: dict(v) if isinstance(v, dict) else v for k, v in found.items()}


# --- ASGI plumbing ---------------------------------------------------------------------------


async def _read_body(receive: Receive) -> tuple[list[dict[str, Any]], bytes, bool]:
    """The messages read, the body, and whether it is complete (not too big, no
    disconnect): an incomplete one goes to Django, which reads the rest."""
    messages: list[dict[str, Any]] = []
    size = 0
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request":
            return messages, b"", False
        size += len(message.get("body", b""))
        if size > _MAX_BODY:
            return messages, b"", False
        if not message.get("more_body", False):
            return messages, b"".join(m.get("body", b"") for m in messages), True


def _replayed(messages: list[dict[str, Any]], receive: Receive) -> Receive:
    """A ``receive`` that first gives back, verbatim, what was read; then the stream."""
    pending = list(reversed(messages))

    async def replay() -> dict[str, Any]:
        if pending:
            return pending.pop()
        return await receive()

    return replay


Answer = tuple[int, Any, list[tuple[bytes, bytes]]]  # status, data, the handler's headers


async def _until_disconnect(call: Call, receive: Receive) -> Answer | None:
    """Run the controller call; cancel it if the client disconnects first."""
    work = asyncio.ensure_future(_answer(call))
    listen = asyncio.ensure_future(_disconnected(receive))
    try:
        await asyncio.wait({work, listen}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        listen.cancel()
    if not work.done():
        work.cancel()
        await asyncio.gather(work, return_exceptions=True)
        return None
    return work.result()


async def _answer(call: Call) -> Answer:
    try:
        status, data = await call()
        return status, data, []
    except (SandmanError, *OUTAGE_ERRORS) as exc:  # a lost database: the views' 503
        from sandman_site.api_errors import exception_handler

        response = exception_handler(exc, {})
        assert response is not None  # its headers: e.g. a 503's Retry-After
        extra = [
            (k.lower().encode("latin-1"), str(v).encode("latin-1"))
            for k, v in response.items()
            if k.lower() != "content-type"  # the view's JSON type is in its headers already
        ]
        return response.status_code, response.data, extra


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _send_json(
    send: Send, status: int, data: Any, view_headers: list[tuple[bytes, bytes]]
) -> None:
    content = JSONRenderer().render(data)
    headers = [*view_headers, (b"content-length", str(len(content)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": content})
