"""The one async client for a sandbox's execd: typed calls, answers read through ``execd.protocol``.

    async with ExecdClient("10.0.0.7:7070", token, session=shared) as execd:
        if (await execd.health()).ok:
            answer = await execd.exec("pytest -q", timeout_s=600)

Built on aiohttp. Give it a session to share connections across sandboxes (the session's
connector keeps one keep-alive connection per address; see ``new_session``, and
``SharedSession`` for the one session a controller or provider keeps); without one it opens
its own and closes it in ``close``.

Rules a reader must not break:
* Every answer is parsed with its route's ``execd.protocol`` shape; a 200 of another shape,
  or an error answer that is not ``{"error", "detail"}``, raises ``ExecdBadAnswer`` - never a
  guessed default.
* Three errors, all ``ExecdError`` with the ``address``: ``ExecdUnavailable`` (the exchange
  failed: connect, reset, timeout, not HTTP), ``ExecdRefused`` (execd answered an error, with
  its status, code and detail), ``ExecdBadAnswer`` (an answer of an undeclared shape).
* Only idempotent GET routes are retried, once, and only after the server closed a kept
  connection before answering (the idle-close race); a POST is never sent twice.
* The token is never part of an error message or ``repr``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from types import TracebackType
from typing import Any, TypeVar

import aiohttp

from execd.protocol import (
    BaselineAnswer,
    CheckAnswer,
    EnvAnswer,
    EnvRequest,
    ErrorAnswer,
    ExecAnswer,
    ExecRequest,
    HealthAnswer,
    ProbeAnswer,
    ProtocolError,
    ReadAnswer,
    ReadBytesAnswer,
    ReadBytesRequest,
    ReadRequest,
    ResetAnswer,
    RestoreAnswer,
    StateRequest,
    WriteAnswer,
    WriteRequest,
)

T = TypeVar("T")

# An exec's HTTP wait outlasts execd's own command timeout, so execd's answer (exit 124)
# arrives instead of a client-side timeout.
EXEC_MARGIN_S = 30.0
# execd drops an idle keep-alive connection after an hour; a warm pod's health check
# before hand-out should find its connection still open (warm pods idle up to ~300 s).
KEEPALIVE_S = 900.0


class ExecdError(Exception):
    """Any failed execd call; ``address`` is the sandbox's host:port."""

    def __init__(self, address: str, message: str) -> None:
        super().__init__(f"execd at {address}: {message}")
        self.address = address


class ExecdUnavailable(ExecdError):
    """The HTTP exchange failed (connect, reset, timeout, not an HTTP answer)."""


class ExecdRefused(ExecdError):
    """execd answered an error: HTTP ``status`` and its ``{"error", "detail"}`` body."""

    def __init__(self, address: str, status: int, answer: ErrorAnswer) -> None:
        super().__init__(address, f"{status} {answer.error}: {answer.detail}")
        self.status = status
        self.code = answer.error
        self.detail = answer.detail
        self.extra = answer.extra


class ExecdBadAnswer(ExecdError):
    """An answer of a shape ``execd.protocol`` does not declare (route and field named)."""

    def __init__(self, address: str, status: int, error: ProtocolError) -> None:
        super().__init__(address, f"HTTP {status}: {error}")
        self.status = status
        self.route = error.route
        self.field = error.field


def new_session(*, keepalive_s: float | None = KEEPALIVE_S) -> aiohttp.ClientSession:
    """A session to share between clients: no pool limit, connections kept ``keepalive_s``
    (None: none kept, each closed after its request -- for a caller that talks to each
    sandbox once)."""
    if keepalive_s is None:
        connector = aiohttp.TCPConnector(limit=0, force_close=True)
    else:
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=keepalive_s)
    return aiohttp.ClientSession(connector=connector)


class SharedSession:
    """One ``new_session()`` for every client of a controller or provider.

    Opened lazily on the event loop that first asks for it, and never used from another:
    asked from a new loop (a controller restarted on a new thread), it closes the old one
    (on its own loop if that still runs) and opens a new one. ``close`` closes it; the
    next ``get`` opens a fresh one.
    """

    def __init__(self, *, keepalive_s: float | None = KEEPALIVE_S) -> None:
        self._keepalive_s = keepalive_s
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def get(self) -> aiohttp.ClientSession:
        """The session of the running loop (opened now if there is none)."""
        loop = asyncio.get_running_loop()
        if self._session is not None and (self._session.closed or self._loop is not loop):
            await self.close()
        if self._session is None:
            self._session = new_session(keepalive_s=self._keepalive_s)
            self._loop = loop
        return self._session

    async def close(self) -> None:
        session, loop, self._session, self._loop = self._session, self._loop, None, None
        if session is None or session.closed:
            return
        if loop is asyncio.get_running_loop() or loop is None or loop.is_closed():
            await session.close()  # a closed loop's connector has nothing left to wait for
        elif loop.is_running():
            asyncio.run_coroutine_threadsafe(session.close(), loop)


class ExecdClient:
    """One sandbox's execd at ``address`` (host:port) with its bearer ``token``.

    ``token=""`` sends no Authorization header (enough for ``health``). ``timeout_s`` bounds
    each call but ``exec``, whose bound is its command timeout plus ``EXEC_MARGIN_S``.
    """

    def __init__(
        self,
        address: str,
        token: str,
        *,
        session: aiohttp.ClientSession | None = None,
        timeout_s: float = 30.0,
    ) -> None:
        host, sep, port = address.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"execd address {address!r} is not host:port")
        self.address = address
        self.timeout_s = timeout_s
        self._base = f"http://{address}"
        self._headers = {"Accept": "application/json"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        self._session = session
        self._own_session = session is None

    def __repr__(self) -> str:  # never shows the token
        return f"<ExecdClient {self.address}>"

    async def __aenter__(self) -> ExecdClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the session if this client opened it (a shared one stays open)."""
        if self._own_session and self._session is not None:
            await self._session.close()
            self._session = None

    # --- routes ---------------------------------------------------------------------------

    async def health(self, *, timeout_s: float | None = None) -> HealthAnswer:
        return await self._call(HealthAnswer.from_json, "GET", "/health", None, timeout_s)

    async def exec(
        self,
        command: str,
        *,
        timeout_s: float | None = None,
        cwd: str | None = None,
        isolate: bool = False,
        max_output_bytes: int | None = None,
    ) -> ExecAnswer:
        """One command in the persistent shell (execd's default timeout when None); ``cwd``
        for this call only, ``isolate`` in a subshell that cannot change the shell."""
        body = ExecRequest(
            command,
            timeout_s=timeout_s,
            cwd=cwd,
            isolate=isolate or None,
            max_output_bytes=max_output_bytes,
        ).to_json()
        wait = (timeout_s if timeout_s is not None else 300.0) + EXEC_MARGIN_S
        return await self._call(ExecAnswer.from_json, "POST", "/exec", body, wait)

    async def read(
        self, path: str, *, start_line: int = 1, max_lines: int | None = None
    ) -> ReadAnswer:
        body = ReadRequest(path, start_line=start_line, max_lines=max_lines).to_json()
        return await self._call(ReadAnswer.from_json, "POST", "/files/read", body)

    async def read_bytes(
        self, path: str, *, offset: int = 0, length: int | None = None
    ) -> ReadBytesAnswer:
        """``.data()`` on the answer gives the exact bytes (``length`` from ``offset``)."""
        body = ReadBytesRequest(path, offset, length).to_json()
        return await self._call(ReadBytesAnswer.from_json, "POST", "/files/read_bytes", body)

    async def write(
        self,
        path: str,
        content: str | bytes,
        *,
        expected_sha256: str | None = None,
        mode: int | str | None = None,
        make_parents: bool = False,
    ) -> WriteAnswer:
        """Atomic; with ``expected_sha256`` execd refuses (409 sha_mismatch) a changed file."""
        body = WriteRequest.of(path, content, expected_sha256, mode, make_parents).to_json()
        return await self._call(WriteAnswer.from_json, "POST", "/files/write", body)

    async def env(self) -> dict[str, str]:
        return (await self._call(EnvAnswer.from_json, "GET", "/env")).env

    async def set_env(
        self, set: dict[str, str] | None = None, unset: list[str] | None = None
    ) -> dict[str, str]:
        body = EnvRequest(set or {}, unset or []).to_json()
        return (await self._call(EnvAnswer.from_json, "POST", "/env", body)).env

    async def reset(self) -> ResetAnswer:
        """Kill every process the sandbox started and restart its shell."""
        return await self._call(ResetAnswer.from_json, "POST", "/reset", {})

    async def state_baseline(self, request: StateRequest | None = None) -> BaselineAnswer:
        body = (request or StateRequest()).to_json()
        return await self._call(BaselineAnswer.from_json, "POST", "/state/baseline", body)

    async def state_check(self) -> CheckAnswer:
        return await self._call(CheckAnswer.from_json, "POST", "/state/check", {})

    async def state_restore(self) -> RestoreAnswer:
        """Undo every difference it can; the answer includes the check that follows."""
        return await self._call(RestoreAnswer.from_json, "POST", "/state/restore", {})

    async def probe(self) -> ProbeAnswer:
        return await self._call(ProbeAnswer.from_json, "GET", "/probe")

    # --- transport -------------------------------------------------------------------------

    async def _call(
        self,
        parse: Callable[[Any], T],
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        wait: float | None = None,
    ) -> T:
        """A 200 answer read with ``parse``; raises one of the three ``ExecdError`` kinds."""
        route = f"{method} {path}"
        for attempt in (1, 2):
            try:
                status, data = await self._exchange(method, path, body, wait)
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
                on_open_connection = not isinstance(exc, aiohttp.ClientConnectorError)
                if method == "GET" and attempt == 1 and on_open_connection:
                    continue  # a kept connection closed while idle: one fresh connect
                raise ExecdUnavailable(self.address, f"{route}: {_what(exc)}") from exc
            except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                raise ExecdUnavailable(self.address, f"{route}: {_what(exc)}") from exc
            payload = self._decode(route, status, data)
            try:
                return parse(payload)
            except ProtocolError as problem:
                raise ExecdBadAnswer(self.address, status, problem) from None
        raise AssertionError("unreachable")  # pragma: no cover

    async def _exchange(
        self, method: str, path: str, body: dict[str, Any] | None, wait: float | None
    ) -> tuple[int, bytes]:
        if self._session is None:
            self._session = aiohttp.ClientSession()
        timeout = aiohttp.ClientTimeout(total=wait if wait is not None else self.timeout_s)
        async with self._session.request(
            method, self._base + path, json=body, headers=self._headers, timeout=timeout
        ) as response:
            return response.status, await response.read()

    def _decode(self, route: str, status: int, data: bytes) -> Any:
        try:
            payload = json.loads(data) if data else None
        except ValueError:
            payload = data[:80].decode("utf-8", "replace")
            problem = ProtocolError(route, "", f"the answer is not JSON: {payload!r}")
            raise ExecdBadAnswer(self.address, status, problem) from None
        if status == 200:
            return payload
        try:
            error = ErrorAnswer.from_json(payload, route)
        except ProtocolError as problem:
            raise ExecdBadAnswer(self.address, status, problem) from None
        raise ExecdRefused(self.address, status, error)


def _what(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
