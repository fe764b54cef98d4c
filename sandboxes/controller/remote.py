"""The controller as a web worker sees it: the same facade, answered by the controller process.

``RemoteController`` has the methods the API calls on a ``Controller`` (``aacquire``,
``arelease``, ``ajob_of_in_use``, ``acquire``, ``release``, ``prewarm``, ``drain``,
``check_image``, ``pacer_queue_length``) and sends each one over
``SANDMAN_CONTROLLER_SOCKET`` to the controller process (``rpc.py``). An event loop keeps
ONE connection with many calls in flight; a sync caller (a Django request thread) opens a
short connection per call.

Invariants a reader must not break:
* An error answered by the controller is raised here as the same ``SandmanError`` class
  (matched by its wire code), so the API's error contract is the in-process one.
* A controller that cannot be reached, or whose connection drops with calls in flight,
  is ``503 controller_unavailable``, never a hang: the caller may retry (an acquire with
  its ``Idempotency-Key`` gets the sandbox a lost answer named, §7).
* A cancelled awaiting caller (its HTTP client left) sends ``cancel``: the controller
  stops waiting for it, as in-process.
* ``check_image`` needs no controller: the provider built from the settings answers it
  here (it reads template directories; no loop, no network).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import socket
import weakref
from typing import Any

from django.db import OperationalError

from sandboxes.controller.rpc import MAX_LINE, encode
from sandboxes.controller.runtime import AcquireResult, PrewarmKey
from sandboxes.providers import get_provider
from sandboxes.providers.base import Provider
from sandman_site.errors import ControllerUnavailable, SandmanError


def _error_classes() -> dict[str, type[SandmanError]]:
    import sandboxes.addresses  # noqa: F401  (defines AddressFloorReached)

    found: dict[str, type[SandmanError]] = {}
    todo: list[type[SandmanError]] = [SandmanError]
    while todo:
        klass = todo.pop()
        found.setdefault(klass.code, klass)
        todo.extend(klass.__subclasses__())
    return found


def raise_error(body: dict[str, Any]) -> None:
    """Raise what the controller answered (``rpc.error_body``)."""
    if body.get("outage"):
        raise OperationalError(body.get("message") or "database unavailable")
    if "internal" in body:
        raise RuntimeError(f"controller process: {body['internal']}")
    klass = _error_classes().get(body["code"])
    if klass is None or klass.status != body["status"]:
        error = SandmanError(body["message"], body.get("extra"))
        error.code, error.status = body["code"], body["status"]
        raise error
    raise klass(body["message"], body.get("extra"))


class _Connection:
    """One event loop's connection: calls matched to answers by id."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self.pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.ids = itertools.count(1)
        self.reading = asyncio.ensure_future(self._read(reader))

    @property
    def open(self) -> bool:
        return not self.reading.done() and not self.writer.is_closing()

    async def _read(self, reader: asyncio.StreamReader) -> None:
        try:
            while line := await reader.readline():
                answer = json.loads(line)
                future = self.pending.pop(int(answer["id"]), None)
                if future is not None and not future.done():
                    future.set_result(answer)
        except (ConnectionError, ValueError, asyncio.LimitOverrunError):
            pass
        finally:
            self.writer.close()
            for future in self.pending.values():
                if not future.done():
                    future.set_exception(
                        ControllerUnavailable("the connection to the controller process dropped")
                    )
            self.pending.clear()

    async def call(self, op: str, args: dict[str, Any]) -> Any:
        call_id = next(self.ids)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.pending[call_id] = future
        self.writer.write(encode({"id": call_id, "op": op, "args": args}))
        try:
            answer = await future
        except asyncio.CancelledError:
            self.pending.pop(call_id, None)
            if self.open:
                self.writer.write(encode({"id": call_id, "op": "cancel"}))
            raise
        if "error" in answer:
            raise_error(answer["error"])
        return answer.get("ok")


class RemoteController:
    """The controller facade over the controller process's socket."""

    started = True  # the web side cannot tell; a call to a stopped controller is a 503

    def __init__(self, path: str, *, provider: Provider | None = None) -> None:
        self.path = path
        self._provider = provider
        self._connections: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Connection]
        self._connections = weakref.WeakKeyDictionary()
        self._connecting: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock]
        self._connecting = weakref.WeakKeyDictionary()

    # -- the facade ----------------------------------------------------------------------------
    async def aacquire(self, **kwargs: Any) -> AcquireResult:
        return AcquireResult(**await self._acall("acquire", kwargs))

    async def arelease(self, **kwargs: Any) -> None:
        await self._acall("release", kwargs)

    async def ajob_of_in_use(self, *, sandbox_id: int) -> int | None:
        job_id = await self._acall("job_of_in_use", {"sandbox_id": sandbox_id})
        return None if job_id is None else int(job_id)

    def acquire(self, **kwargs: Any) -> AcquireResult:
        return AcquireResult(**self._call("acquire", kwargs))

    def release(self, **kwargs: Any) -> None:
        self._call("release", kwargs)

    def prewarm(self, *, job_id: int, keys: list[PrewarmKey]) -> None:
        self._call("prewarm", {"job_id": job_id, "keys": [dataclasses.asdict(k) for k in keys]})

    def drain(self, *, job_id: int) -> None:
        self._call("drain", {"job_id": job_id})

    def ready(self, timeout_s: float = 2.0) -> dict[str, Any]:
        """The controller process's own view (``ping``: started, stopping, its Lease), for
        a web worker's ``/readyz``; ``ControllerUnavailable`` when it does not answer."""
        return dict(self._call("ping", {}, timeout=timeout_s))

    def stats(self) -> dict[str, Any]:
        return dict(self._call("stats", {}, timeout=10))

    def pacer_queue_length(self) -> int:
        stats = self.stats()
        return int(stats.get("cluster_queue", 0)) + sum(
            int(j.get("queue", 0)) for j in stats.get("jobs", {}).values()
        )

    def check_image(self, image: str, base_commit: str | None) -> bool | None:
        return self.image_checker().check_image(image, base_commit)

    def image_checker(self) -> Provider:
        """The backend's provider this process checks images with (no loop, no socket: a
        worker asks it for every acquire's body), built on first use. ``sandman_site.asgi``
        builds it at a worker's start: ~50 ms of imports and set-up that the first
        acquire's event loop otherwise spent while the burst's other requests waited."""
        if self._provider is None:
            self._provider = get_provider()
        return self._provider

    @property
    def image_checker_built(self) -> bool:
        return self._provider is not None

    # -- transport -------------------------------------------------------------------------------
    async def _acall(self, op: str, args: dict[str, Any]) -> Any:
        connection = await self._connection()
        return await connection.call(op, args)

    async def _connection(self) -> _Connection:
        loop = asyncio.get_running_loop()
        connection = self._connections.get(loop)
        if connection is not None and connection.open:
            return connection
        lock = self._connecting.setdefault(loop, asyncio.Lock())
        async with lock:
            connection = self._connections.get(loop)
            if connection is not None and connection.open:
                return connection
            try:
                reader, writer = await asyncio.open_unix_connection(self.path, limit=MAX_LINE)
            except OSError as exc:
                raise ControllerUnavailable(
                    f"the controller process does not answer at {self.path}"
                ) from exc
            self._connections[loop] = connection = _Connection(reader, writer)
            return connection

    def _call(self, op: str, args: dict[str, Any], timeout: float | None = None) -> Any:
        """One blocking call on its own connection (Django's request threads)."""
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(timeout)
                sock.connect(self.path)
                sock.sendall(encode({"id": 1, "op": op, "args": args}))
                with sock.makefile("rb") as stream:
                    line = stream.readline(MAX_LINE)
        except OSError as exc:
            raise ControllerUnavailable(
                f"the controller process does not answer at {self.path}"
            ) from exc
        if not line:
            raise ControllerUnavailable("the connection to the controller process dropped")
        answer = json.loads(line)
        if "error" in answer:
            raise_error(answer["error"])
        return answer.get("ok")
