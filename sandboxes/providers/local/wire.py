"""Two small asyncio I/O helpers for the local provider: execd's health, a ready line.

Both are bounded by a timeout and use no threads, so a burst of creates waiting for
readiness never queues behind the default executor's few workers.
"""

from __future__ import annotations

import asyncio
import json
import os


async def get_json(
    address: str, path: str, *, token: str = "", timeout_s: float
) -> tuple[int, object]:
    """One ``GET`` to ``http://address/path`` (Connection: close): (status, parsed body)."""
    host, _, port = address.rpartition(":")
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    request = (
        f"GET {path} HTTP/1.1\r\nHost: {address}\r\n{auth}"
        "Accept: application/json\r\nConnection: close\r\n\r\n"
    ).encode()
    async with asyncio.timeout(timeout_s):
        reader, writer = await asyncio.open_connection(host.strip("[]"), int(port))
        try:
            writer.write(request)
            await writer.drain()
            raw = await reader.read()
        finally:
            writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line = head.split(b"\r\n", 1)[0].split()
    status = int(status_line[1]) if len(status_line) >= 2 and status_line[1].isdigit() else 0
    try:
        return status, json.loads(body.decode("utf-8")) if body else None
    except (UnicodeDecodeError, json.JSONDecodeError):
        return status, None


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
