"""The controller's local socket: web worker processes call the controller process here.

With ``SANDMAN_CONTROLLER_SOCKET`` set, the service runs as one controller process
(``manage.py run_controller``: the pools, creates, deletes, sweeps, the grading runner)
and N web worker processes (the ASGI server's workers) that parse HTTP, authenticate,
validate and render, and send each hot call here (``remote.py``). The two sides share no
interpreter, so a web worker's requests never wait for the GIL behind the controller's
create work, and HTTP work is spread over every core.

Wire: newline-delimited JSON on a Unix socket, many calls in flight per connection.
A request is ``{"id": N, "op": NAME, "args": {...}}``; its answer is ``{"id": N, "ok":
VALUE}`` or ``{"id": N, "error": {"code", "status", "message", "extra"}}`` (a
``SandmanError``; ``{"outage": true}`` for a lost database, ``{"internal": ...}`` for a
bug). ``{"id": N, "op": "cancel"}`` cancels call N (its client went away).

Invariants a reader must not break:
* The server runs ON the controller's loop, so a call is awaited in place, with the same
  code path, rows and restart-safety as an in-process caller (``Controller._acall``).
* A connection that closes (a web worker killed or restarted) cancels every call it has in
  flight, exactly as a disconnecting HTTP client cancels its own: an acquire's wait is
  cancelled, never a create, and its acquisition row is finished ``cancelled`` (§7).
* The socket file is created with mode 0600 (only the service's own user may call it).
* An orderly stop DRAINS (``stop(drain_s=...)``): the socket stops taking connections and
  every new call is answered ``controller_unavailable`` (a web worker answers it 503 with
  ``Retry-After``; the trainer client resends a keyed call), while the calls already in
  flight run to their answer for up to ``drain_s``; only what is still running then is
  cancelled (an acquire's wait, never a create: its row ends ``cancelled``) and its
  connection closed. A web worker's ``/readyz`` pings on a fresh connection, so it turns
  503 (unreachable) as soon as the drain starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
from collections.abc import Awaitable, Callable
from typing import Any

from sandboxes.controller.core import Controller
from sandboxes.controller.runtime import PrewarmKey
from sandman_site import election
from sandman_site.dbguard import OUTAGE_ERRORS
from sandman_site.errors import ControllerUnavailable, SandmanError

log = logging.getLogger(__name__)
MAX_LINE = 1 << 20  # a call is a few hundred bytes; a prewarm of many keys a few KiB


def encode(message: dict[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode() + b"\n"


def error_body(exc: BaseException) -> dict[str, Any]:
    """What crosses the wire for a failed call (``remote.raise_error`` rebuilds it)."""
    if isinstance(exc, SandmanError):
        return {
            "code": exc.code,
            "status": exc.status,
            "message": exc.message,
            "extra": exc.extra or None,
        }
    if isinstance(exc, OUTAGE_ERRORS):
        return {"outage": True, "message": str(exc)}
    return {"internal": f"{type(exc).__name__}: {exc}"}


def _forget(calls: dict[int, asyncio.Task[None]], call_id: int) -> Callable[[Any], None]:
    def done(_task: Any) -> None:
        calls.pop(call_id, None)

    return done


class ControllerRpcServer:
    """Answers the web workers' calls on the controller's own loop."""

    def __init__(self, controller: Controller, path: str) -> None:
        self._controller = controller
        self._path = path
        self._server: asyncio.AbstractServer | None = None
        self._stopping = False
        self._inflight: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._ops: dict[str, Callable[[dict[str, Any]], Awaitable[Any]]] = {
            "acquire": self._acquire,
            "release": self._release,
            "prewarm": self._prewarm,
            "drain": self._drain,
            "stats": self._stats,
            "job_of_in_use": self._job_of_in_use,
            "ping": self._ping,
        }

    def start(self) -> None:
        """Listen (from any thread; the server lives on the controller's loop)."""
        loop = self._controller.loop
        if loop is None:
            raise RuntimeError("start the controller before its socket")
        asyncio.run_coroutine_threadsafe(self._listen(), loop).result(timeout=30)

    def stop(self, drain_s: float = 0) -> dict[str, int]:
        """Stop taking calls, let those in flight finish for up to ``drain_s``, cancel the
        rest; the counts (``drained``: answered meanwhile, ``cut``: cancelled)."""
        loop = self._controller.loop
        counts = {"drained": 0, "cut": 0}
        if self._server is not None and loop is not None and loop.is_running():
            future = asyncio.run_coroutine_threadsafe(self._close(drain_s), loop)
            counts = future.result(timeout=drain_s + 30)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._path)
        return counts

    async def _listen(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._path)  # a socket file left by a killed controller process
        old = os.umask(0o177)
        try:
            self._server = await asyncio.start_unix_server(
                self._serve, path=self._path, limit=MAX_LINE
            )
        finally:
            os.umask(old)

    async def _close(self, drain_s: float) -> dict[str, int]:
        assert self._server is not None
        self._stopping = True
        self._server.close()  # no new connection; the open ones get "stopping" answers
        running = set(self._inflight)
        done: set[asyncio.Task[None]] = set()
        if running and drain_s > 0:
            done, _ = await asyncio.wait(running, timeout=drain_s)
        cut = [task for task in running - done if not task.done()]
        for task in cut:
            task.cancel()
        if cut:
            await asyncio.gather(*cut, return_exceptions=True)
        for writer in list(self._writers):
            writer.close()
        await self._server.wait_closed()  # after the writers: 3.12 waits for connections
        counts = {"drained": len(done), "cut": len(cut)}
        log.info("controller socket closed: %(drained)d calls drained, %(cut)d cut", counts)
        return counts

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        calls: dict[int, asyncio.Task[None]] = {}
        self._writers.add(writer)
        try:
            while line := await reader.readline():
                message = json.loads(line)
                call_id = int(message["id"])
                if message.get("op") == "cancel":
                    task = calls.get(call_id)
                    if task is not None:
                        task.cancel()
                    continue
                task = asyncio.ensure_future(self._answer(call_id, message, writer))
                calls[call_id] = task
                self._inflight.add(task)
                task.add_done_callback(self._inflight.discard)
                task.add_done_callback(_forget(calls, call_id))
        except (ConnectionError, ValueError, KeyError, asyncio.LimitOverrunError) as exc:
            log.warning("controller socket: a connection ended: %s", exc)
        finally:
            for task in list(calls.values()):  # the web worker is gone: so are its waits
                task.cancel()
            if calls:
                await asyncio.gather(*calls.values(), return_exceptions=True)
            self._writers.discard(writer)
            writer.close()

    async def _answer(self, call_id: int, message: dict[str, Any], writer: Any) -> None:
        op = self._ops.get(str(message.get("op")))
        try:
            if op is None:
                raise ValueError(f"unknown operation {message.get('op')!r}")
            if self._stopping:
                raise ControllerUnavailable("the controller process is stopping; resend")
            answer: dict[str, Any] = {"id": call_id, "ok": await op(message.get("args") or {})}
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if not isinstance(exc, (SandmanError, *OUTAGE_ERRORS)):
                log.exception("controller socket: %s failed", message.get("op"))
            answer = {"id": call_id, "error": error_body(exc)}
        if not writer.is_closing():
            writer.write(encode(answer))

    async def _acquire(self, args: dict[str, Any]) -> dict[str, Any]:
        result = await self._controller.aacquire(**args)
        return dataclasses.asdict(result)

    async def _release(self, args: dict[str, Any]) -> None:
        await self._controller.arelease(**args)

    async def _prewarm(self, args: dict[str, Any]) -> None:
        keys = [PrewarmKey(**key) for key in args["keys"]]
        await self._controller.aprewarm(job_id=int(args["job_id"]), keys=keys)

    async def _drain(self, args: dict[str, Any]) -> None:
        await self._controller.adrain(job_id=int(args["job_id"]))

    async def _stats(self, args: dict[str, Any]) -> dict[str, Any]:
        return json.loads(json.dumps(await self._controller.astats(), default=str))

    async def _job_of_in_use(self, args: dict[str, Any]) -> int | None:
        return await self._controller.ajob_of_in_use(sandbox_id=int(args["sandbox_id"]))

    async def _ping(self, args: dict[str, Any]) -> dict[str, Any]:
        """What a web worker's ``/readyz`` reports: started, and the Lease."""
        return {"started": bool(self._controller.started), **election.describe()}
