"""Small asyncio I/O helpers for the local provider: execd's health, a ready line.

All are bounded by a timeout and use no threads, so a burst of creates waiting for
readiness never queues behind the default executor's few workers.

``KeptConnections`` keeps one HTTP/1.1 keep-alive connection per sandbox for its health
checks: the check before a warm hand-out then costs one request on an open connection
instead of a connect (through the egress relay: a new relay thread and an upstream
connect inside the sandbox). A connection found closed is replaced once, at once; one
whose exchange failed or timed out is closed, never reused.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os


async def read_line(fd: int, timeout_s: float) -> bytes:
    """The first line written to the non-blocking pipe ``fd`` (b"" if it closed first).

    Raises ``TimeoutError`` when no full line (nor EOF) arrives in time.
    """
    loop = asyncio.get_running_loop()
    buffer = bytearray()
    finished: asyncio.Future[None] = loop.create_future()

    def readable() -> None:
        try:
            chunk = os.read(fd, 4096)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        buffer.extend(chunk)
        if (not chunk or b"\n" in buffer) and not finished.done():
            finished.set_result(None)

    loop.add_reader(fd, readable)
    try:
        await asyncio.wait_for(finished, max(timeout_s, 0.0))
    finally:
        loop.remove_reader(fd)
    return bytes(buffer).split(b"\n", 1)[0]


Stream = tuple[asyncio.StreamReader, asyncio.StreamWriter, str]


class KeptConnections:
    """One kept-alive connection per key (a sandbox's name) for ``GET`` requests."""

    def __init__(self) -> None:
        self._idle: dict[str, Stream] = {}

    async def get_json(
        self, key: str, address: str, path: str, *, timeout_s: float
    ) -> tuple[int, object]:
        kept = self._idle.pop(key, None)
        if kept is not None and kept[2] == address:
            try:
                return await self._exchange(key, kept, path, timeout_s)
            except (OSError, EOFError, asyncio.IncompleteReadError, ValueError):
                pass  # closed while idle (execd restarted, idle timeout): one new connect
        elif kept is not None:
            _close(kept)
        host, _, port = address.rpartition(":")
        async with asyncio.timeout(timeout_s):
            reader, writer = await asyncio.open_connection(host.strip("[]"), int(port))
        return await self._exchange(key, (reader, writer, address), path, timeout_s)

    async def _exchange(
        self, key: str, stream: Stream, path: str, timeout_s: float
    ) -> tuple[int, object]:
        reader, writer, address = stream
        request = (
            f"GET {path} HTTP/1.1\r\nHost: {address}\r\n"
            "Accept: application/json\r\nConnection: keep-alive\r\n\r\n"
        ).encode()
        try:
            async with asyncio.timeout(timeout_s):
                writer.write(request)
                await writer.drain()
                head = await reader.readuntil(b"\r\n\r\n")
                status, length, keep = _parse_head(head)
                body = await reader.readexactly(length) if length is not None else b""
                if length is None:
                    body, keep = await reader.read(), False
        except BaseException:
            _close(stream)
            raise
        if keep:
            old = self._idle.pop(key, None)
            if old is not None:
                _close(old)
            self._idle[key] = stream
        else:
            _close(stream)
        try:
            return status, json.loads(body.decode("utf-8")) if body else None
        except (UnicodeDecodeError, json.JSONDecodeError):
            return status, None

    def drop(self, key: str) -> None:
        stream = self._idle.pop(key, None)
        if stream is not None:
            _close(stream)

    def close(self) -> None:
        for key in list(self._idle):
            self.drop(key)


def _parse_head(head: bytes) -> tuple[int, int | None, bool]:
    """(status, Content-Length or None, whether the server keeps the connection)."""
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split()
    if len(parts) < 2 or not parts[1].isdigit():
        raise ValueError(f"not an HTTP answer: {lines[0][:80]!r}")
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip().lower()
    length = headers.get("content-length")
    keep = parts[0] == "HTTP/1.1" and headers.get("connection") != "close"
    return int(parts[1]), int(length) if length and length.isdigit() else None, keep


def _close(stream: Stream) -> None:
    with contextlib.suppress(Exception):
        stream[1].close()
