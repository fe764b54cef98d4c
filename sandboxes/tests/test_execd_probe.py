"""The web workers' one-shot ``/health`` check (``sandboxes.execd_probe.HealthProbe``) against
a REAL execd over HTTP, and against a raw TCP server that answers whatever bytes a case
needs; each raw case is also asked of the controller's ``ExecdHealth`` (aiohttp), so the
two checks of a pod cannot come to differ on an answer."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import pytest_asyncio

from execd.tests.helpers import TOKEN, Execd, ipv6_loopback
from sandboxes.execd_probe import MAX_BODY, HealthProbe
from sandboxes.providers.local.health import ExecdHealth
from sandboxes.tests.execd_support import running_execd

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60)]

FULL = {"ok": True, "version": "test", "shell_alive": True}  # execd's declared shape


@pytest.fixture
def execd(tmp_path: Path) -> Iterator[Execd]:
    with running_execd(tmp_path) as daemon:
        yield daemon


async def test_real_execd_with_its_token_without_one_and_with_a_wrong_one(execd: Execd) -> None:
    probe = HealthProbe(timeout_s=10)
    address = f"127.0.0.1:{execd.port}"
    assert await probe.check("sb", address, TOKEN) is True
    assert await probe.check("sb", address) is True  # /health needs no token...
    assert await probe.check("sb", address, TOKEN + "x") is False  # ...but checks a sent one
    for _ in range(20):  # one connection each, closed: execd keeps serving new ones
        assert await probe.check("sb", address, TOKEN) is True


@dataclass
class _Raw:
    """A TCP server on this loop answering each connection with ``answer`` (raw bytes), or
    never (``answer=None``); it records each request and whether the client closed."""

    answer: bytes | None
    hang_up: bool = False  # close right after the answer (one cut short: execd gone)
    requests: list[bytes] = field(default_factory=list)
    closed_by_client: asyncio.Event = field(default_factory=asyncio.Event)
    server: asyncio.Server | None = None

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            self.requests.append(await reader.readuntil(b"\r\n\r\n"))
            if self.answer is None:
                await reader.read()  # never answers; the client gives up and closes
            else:
                writer.write(self.answer)
                await writer.drain()
                if self.hang_up:
                    return
            # A kept connection would leave this read waiting: EOF means the client closed.
            if await reader.read() == b"":
                self.closed_by_client.set()
        except (ConnectionError, asyncio.IncompleteReadError):
            self.closed_by_client.set()
        finally:
            writer.close()

    @property
    def address(self) -> str:
        assert self.server is not None
        return f"127.0.0.1:{self.server.sockets[0].getsockname()[1]}"


@pytest_asyncio.fixture
async def raw() -> AsyncIterator[list[_Raw]]:
    made: list[_Raw] = []
    yield made
    for one in made:
        assert one.server is not None
        one.server.close()
        await one.server.wait_closed()


async def _serve(made: list[_Raw], answer: bytes | None, *, hang_up: bool = False) -> _Raw:
    one = _Raw(answer, hang_up)
    one.server = await asyncio.start_server(one.handle, "127.0.0.1", 0)
    made.append(one)
    return one


def _http(status: str, body: bytes, *, headers: str | None = None) -> bytes:
    head = headers if headers is not None else f"Content-Length: {len(body)}\r\n"
    return f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n{head}\r\n".encode() + body


def _chunked(body: bytes) -> bytes:
    half = len(body) // 2
    chunks = b"".join(f"{len(p):x}\r\n".encode() + p + b"\r\n" for p in (body[:half], body[half:]))
    return _http("200 OK", chunks + b"0\r\n\r\n", headers="Transfer-Encoding: chunked\r\n")


_CUT_SHORT = "cut short: execd closed before the body ended"
_CASES = {
    "declared and ok": (_http("200 OK", json.dumps(FULL).encode()), True),
    "chunked": (_chunked(json.dumps(FULL).encode()), True),
    "ok false": (_http("200 OK", json.dumps(FULL | {"ok": False}).encode()), False),
    "undeclared shape": (_http("200 OK", b'{"ok": true}'), False),
    "ok not a boolean": (_http("200 OK", json.dumps(FULL | {"ok": "yes"}).encode()), False),
    "not JSON": (_http("200 OK", b"<html>ok</html>"), False),
    "401": (_http("401 Unauthorized", b'{"error": "unauthorized", "detail": "x"}'), False),
    "500 with the declared body": (_http("500 Oops", json.dumps(FULL).encode()), False),
    "not HTTP": (b"SSH-2.0-OpenSSH_9.2\r\n\r\n", False),
    _CUT_SHORT: (
        _http("200 OK", b'{"ok": tr', headers="Content-Length: 53\r\n"),
        False,
    ),
}


@pytest.mark.parametrize("case", list(_CASES))
async def test_each_answer_means_the_same_to_the_probe_and_to_the_controllers_check(
    raw: list[_Raw], case: str
) -> None:
    answer, healthy = _CASES[case]
    server = await _serve(raw, answer, hang_up=case == _CUT_SHORT)
    probe = HealthProbe(timeout_s=10)
    assert await probe.check("sb", server.address, "tok-1") is healthy
    controller = ExecdHealth(timeout_s=10, keep_connections=False)
    try:
        assert await controller.check("sb", server.address, "tok-1") is healthy
    finally:
        await controller.close()
    request = server.requests[0]
    assert request.startswith(b"GET /health HTTP/1.1\r\n")
    assert b"\r\nAuthorization: Bearer tok-1\r\n" in request
    assert b"\r\nConnection: close\r\n" in request


async def test_the_connection_is_closed_after_the_answer_whatever_it_said(
    raw: list[_Raw],
) -> None:
    for answer, _ in (_CASES["declared and ok"], _CASES["401"], _CASES["not HTTP"]):
        server = await _serve(raw, answer)
        await HealthProbe(timeout_s=10).check("sb", server.address, "tok-1")
        await server.closed_by_client.wait()  # the test's timeout fails it if never


async def test_an_answer_that_never_comes_is_false_within_the_bound_and_closes(
    raw: list[_Raw],
) -> None:
    server = await _serve(raw, None)
    assert await HealthProbe(timeout_s=0.2).check("sb", server.address, "tok-1") is False
    await server.closed_by_client.wait()


async def test_a_body_past_the_bound_is_false(raw: list[_Raw]) -> None:
    padded = json.dumps(FULL | {"version": "v" * MAX_BODY}).encode()
    server = await _serve(raw, _http("200 OK", padded))
    assert await HealthProbe(timeout_s=10).check("sb", server.address) is False
    small = await _serve(raw, _http("200 OK", json.dumps(FULL | {"version": "v" * 100}).encode()))
    assert await HealthProbe(timeout_s=10).check("sb", small.address) is True


@pytest.mark.parametrize(
    ("address", "token"),
    [
        ("127.0.0.1:1", "tok"),  # nothing listens there
        ("127.0.0.1", "tok"),  # no port
        ("127.0.0.1:99999", "tok"),
        ("127.0.0.1:8080/x", "tok"),
        ("user@127.0.0.1:8080", "tok"),
        ("127.0.0.1:8080", "tok\r\nX-Injected: 1"),  # not sendable in a header
        ("127.0.0.1:8080", "tök"),
    ],
)
async def test_an_unreachable_or_unsendable_check_is_false_and_never_raises(
    address: str, token: str
) -> None:
    assert await HealthProbe(timeout_s=5).check("sb", address, token) is False


@pytest.mark.skipif(not ipv6_loopback(), reason="no IPv6 loopback here")
async def test_an_ipv6_pod_ip_reaches_its_execd_through_every_client(tmp_path: Path) -> None:
    """An IPv6 cluster's pod (its ``status.podIP`` an IPv6 address; Kubernetes docs,
    IPv4/IPv6 dual-stack): the address the informer builds from the pod, ``[ADDR]:PORT``,
    is checked by the web workers' probe and the controller's check, and served by the
    trainer-side client, against a real execd listening on that IPv6 address."""
    import types

    from sandboxes.execd_client import ExecdClient
    from sandboxes.providers.kubernetes.informer import ready_info

    with running_execd(tmp_path, host="::1") as daemon:
        pod = {"metadata": {}, "spec": {}, "status": {"podIP": "::1"}}
        config = types.SimpleNamespace(execd_port=daemon.port)
        address = ready_info(pod, config).address  # type: ignore[arg-type]
        assert address == f"[::1]:{daemon.port}"
        probe, controller = HealthProbe(timeout_s=10), ExecdHealth(timeout_s=10)
        try:
            assert await probe.check("sb", address, TOKEN) is True
            assert await controller.check("sb", address, TOKEN) is True
            assert await probe.check("sb", address, TOKEN + "x") is False
        finally:
            await probe.close()
            await controller.close()
        async with ExecdClient(address, TOKEN) as client:
            assert (await client.health()).ok is True
