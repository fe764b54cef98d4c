"""The local backend's one way to execd: its ``GET /health`` over kept connections.

Every execd call of this provider goes through :class:`ExecdHealth`, so replacing the
hand-written client in ``wire.py`` with the shared execd client changes this module only.

Rules a reader must not break:
* A health check answers True or False, never raises: a transport error, a timeout, a
  malformed answer or anything but ``200`` with ``{"ok": true}`` is False.
* A sandbox's kept connection is dropped when the sandbox is destroyed, so a later
  sandbox at the same address never inherits it.
"""

from __future__ import annotations

import asyncio

from sandboxes.providers.local.wire import KeptConnections


class ExecdHealth:
    """execd's ``/health`` per sandbox, one kept-alive connection each."""

    def __init__(self, timeout_s: float) -> None:
        self._timeout_s = timeout_s
        self._kept = KeptConnections()

    async def check(self, name: str, address: str) -> bool:
        try:
            status, body = await self._kept.get_json(
                name, address, "/health", timeout_s=self._timeout_s
            )
        except (OSError, TimeoutError, ValueError, EOFError, asyncio.LimitOverrunError):
            return False
        return status == 200 and isinstance(body, dict) and body.get("ok") is True

    def forget(self, name: str) -> None:
        """The sandbox is going: close its kept connection."""
        self._kept.drop(name)

    def close(self) -> None:
        self._kept.close()
