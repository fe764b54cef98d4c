"""execd's ``GET /health`` as one short request on a new connection: the web workers' check
of a warm pod before they hand it out (``sandboxes.apis.direct``; architecture §3.6).

A direct claim meets each pod once, so nothing is gained by a client session that keeps
connections: through ``aiohttp`` a check on a new connection costs the worker 0.33-0.48 ms
of CPU (its connector, happy-eyeballs connect, request and response objects), where this
costs 0.08 ms (``/tmp`` experiment against a real execd, 500 checks each, uvloop, twice).
It is an ``asyncio.Protocol`` on the loop's own transport, and the answer is read by
``httptools``' response parser (the parser uvicorn runs on), so no HTTP parsing is written
here: it writes one request and hands what comes back to the parser.

Rules a reader must not break (those of ``providers.local.health.ExecdHealth``, which the
controller keeps for its kept connections; the tests run both over the same answers):
* The sandbox's token is sent, and execd answers 401 to a wrong one: a dead sandbox's port
  reused by another sandbox's execd is not healthy.
* A check answers True or False and never raises: a refused connect, a timeout, an answer
  that is not HTTP, a status other than 200, a body past ``MAX_BODY`` or of a shape
  ``execd.protocol`` does not declare is False; only a declared ``{ok, version,
  shell_alive}`` with ``ok`` true is True. An answer whose end only its connection's close
  would tell (neither ``Content-Length`` nor chunked) is False too: execd always sends
  ``Content-Length``, and the parser cannot be told that a close ended a message.
* The whole check (connect, request, answer) is bounded by ``timeout_s``, and its
  connection is closed when the check ends, whatever the answer (``Connection: close``
  is asked for too, so execd ends its thread for it).
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any
from urllib.parse import urlsplit

import httptools

from execd.protocol import HealthAnswer, ProtocolError

log = logging.getLogger(__name__)

MAX_BODY = 16 * 1024  # execd's answer is ~60 bytes; anything near this is not execd


class _Answer(asyncio.Protocol):
    """One request written on connect; the answer's status and body, through httptools."""

    def __init__(self, request: bytes, done: asyncio.Future[tuple[int, bytes]]) -> None:
        self._request = request
        self._done = done
        self._body = bytearray()
        self._parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None

    # asyncio.Protocol
    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        transport.write(self._request)

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(exc)

    def eof_received(self) -> bool:
        self._fail(ConnectionError("execd closed the connection before its answer ended"))
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(exc or ConnectionError("the connection closed before the answer ended"))

    # httptools' callbacks
    def on_body(self, body: bytes) -> None:
        self._body += body
        if len(self._body) > MAX_BODY:
            self._fail(ValueError(f"an answer of more than {MAX_BODY} bytes"))

    def on_message_complete(self) -> None:
        if not self._done.done():
            self._done.set_result((self._parser.get_status_code(), bytes(self._body)))

    def _fail(self, exc: BaseException) -> None:
        if not self._done.done():
            self._done.set_exception(exc)


class HealthProbe:
    """execd's ``/health`` per check, each on its own connection, closed after it."""

    def __init__(self, timeout_s: float) -> None:
        self._timeout_s = timeout_s

    async def check(self, name: str, address: str, token: str = "") -> bool:
        """``address`` is execd's ``host:port`` (``[v6]:port``); ``token`` the sandbox's."""
        try:
            status, body = await self._exchange(address, token)
        except (OSError, TimeoutError, ValueError, httptools.HttpParserError) as exc:
            log.debug("health of %s at %s: %s", name, address, exc)
            return False
        if status != 200:
            log.debug("health of %s at %s: HTTP %s", name, address, status)
            return False
        try:
            return HealthAnswer.from_json(json.loads(body)).ok is True
        except (ValueError, ProtocolError) as exc:
            log.debug("health of %s at %s: %s", name, address, exc)
            return False

    async def _exchange(self, address: str, token: str) -> tuple[int, bytes]:
        url = urlsplit(f"http://{address}")
        host, port = url.hostname, url.port  # a bad port raises ValueError
        if not host or port is None or url.path or url.query or url.username:
            raise ValueError(f"not a host:port address: {address!r}")
        if token and not (token.isascii() and token.isprintable() and " " not in token):
            raise ValueError("a token that cannot be sent in a header")
        request = (
            f"GET /health HTTP/1.1\r\nHost: {url.netloc}\r\nAccept: application/json\r\n"
            + (f"Authorization: Bearer {token}\r\n" if token else "")
            + "Connection: close\r\n\r\n"
        ).encode("ascii")
        loop = asyncio.get_running_loop()
        done: asyncio.Future[tuple[int, bytes]] = loop.create_future()
        answer: _Answer | None = None
        try:
            async with asyncio.timeout(self._timeout_s):
                _, answer = await loop.create_connection(lambda: _Answer(request, done), host, port)
                return await done
        finally:
            if answer is not None and answer.transport is not None:
                answer.transport.close()  # whatever happened: nothing is left open
            if done.done() and not done.cancelled():
                done.exception()  # retrieved: a failure after the answer is not "never retrieved"

    async def close(self) -> None:
        """Nothing is kept between checks (the same interface as ``ExecdHealth``)."""
