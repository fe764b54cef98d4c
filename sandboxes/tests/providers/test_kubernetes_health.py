"""The Kubernetes backend's execd health check (``providers/kubernetes/health.py``) over the
one execd client: only the declared ``{ok, version, shell_alive}`` answer with ``ok`` true is
healthy; any other shape, status or transport failure is False, never an exception."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from sandboxes.providers.kubernetes.health import ExecdHealth

FULL = {"ok": True, "version": "test", "shell_alive": True}


class _Health(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    answer: tuple[int, Any] = (200, FULL)
    seen: list[str | None] = []

    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        self.seen.append(self.headers.get("Authorization"))
        status, body = self.answer
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextlib.contextmanager
def _serve(answer: tuple[int, Any]) -> Iterator[tuple[str, list[str | None]]]:
    seen: list[str | None] = []
    handler = type("Handler", (_Health,), {"answer": answer, "seen": seen})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("answer", "healthy"),
    [
        ((200, FULL), True),
        ((200, {"ok": True}), False),  # the shape the old client read with a default
        ((200, {}), False),
        ((200, [True]), False),
        ((200, {**FULL, "ok": False}), False),
        ((503, {"error": "unavailable", "detail": "starting"}), False),
    ],
)
async def test_only_the_declared_health_answer_with_ok_true_is_healthy(
    answer: tuple[int, Any], healthy: bool
) -> None:
    health = ExecdHealth(timeout_s=10)
    try:
        with _serve(answer) as (address, seen):
            assert await health.check("sb-1", address, "") is healthy
            assert seen == [None]  # readiness probes send no token
    finally:
        await health.close()


@pytest.mark.asyncio
async def test_a_refused_connection_is_unhealthy_not_an_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: the connect is refused
        health = ExecdHealth(timeout_s=10)
        try:
            assert await health.check("sb-1", f"127.0.0.1:{port}", "token") is False
        finally:
            await health.close()
