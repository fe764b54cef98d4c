"""Kubernetes backend: the one place it talks to execd (its ``GET /health``).

Every execd call of this provider goes through :class:`ExecdHealth`, so replacing this
aiohttp client with the shared execd client changes this module only.

Rules a reader must not break:
* A health check answers True or False, never raises: any transport error, a non-200
  status or an unreadable body is False (the caller retries within its budget, or
  refuses the warm pod).
* ``work_item_hook("health", name)``, when set, runs in a thread before the probe is sent,
  so a test gate can hold the probe itself.
"""

from __future__ import annotations

import asyncio

import aiohttp

from sandboxes.providers.kubernetes.calls import WorkItemHook


class ExecdHealth:
    """execd's ``/health`` over one aiohttp session, opened on first use."""

    def __init__(self, timeout_s: float, work_item_hook: WorkItemHook | None = None) -> None:
        self._timeout_s = timeout_s
        self._hook = work_item_hook
        self._http: aiohttp.ClientSession | None = None

    async def check(self, name: str, address: str, token: str) -> bool:
        hook = self._hook
        if hook is not None:  # a test gate may hold the probe here, before it is sent
            await asyncio.to_thread(hook, "health", name)
        if self._http is None or self._http.closed:
            self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self._timeout_s))
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        try:
            async with self._http.get(f"http://{address}/health", headers=headers) as resp:
                if resp.status != 200:
                    return False
                body = await resp.json(content_type=None)
                return bool(body.get("ok", True)) if isinstance(body, dict) else True
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError):
            return False

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
