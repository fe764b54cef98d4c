"""Kubernetes backend: the one place it talks to execd (its ``GET /health``).

Every execd call of this provider goes through :class:`ExecdHealth`, which uses the one
execd client (``sandboxes.execd_client``) over one session shared by every pod, opened on
the provider's loop at first use and closed by ``close``.

Rules a reader must not break:
* The sandbox's token is sent, and execd answers 401 to a wrong one: a pod IP reused by
  another sandbox's pod is not healthy for this one.
* A health check answers True or False, never raises: any ``ExecdError`` - a transport
  error, an error status, or an answer of a shape ``execd.protocol`` does not declare - is
  False (the caller retries within its budget, or refuses the warm pod). Only a declared
  ``{ok, version, shell_alive}`` answer with ``ok`` true is True.
* ``work_item_hook("health", name)``, when set, runs in a thread before the probe is sent,
  so a test gate can hold the probe itself.
"""

from __future__ import annotations

import asyncio
import logging

from sandboxes.execd_client import ExecdClient, ExecdError, SharedSession
from sandboxes.providers.kubernetes.calls import WorkItemHook

log = logging.getLogger(__name__)


class ExecdHealth:
    """execd's ``/health`` through ``ExecdClient`` over one shared session."""

    def __init__(self, timeout_s: float, work_item_hook: WorkItemHook | None = None) -> None:
        self._timeout_s = timeout_s
        self._hook = work_item_hook
        self._session = SharedSession()

    async def check(self, name: str, address: str, token: str) -> bool:
        hook = self._hook
        if hook is not None:  # a test gate may hold the probe here, before it is sent
            await asyncio.to_thread(hook, "health", name)
        try:
            execd = ExecdClient(
                address, token, session=await self._session.get(), timeout_s=self._timeout_s
            )
            return (await execd.health()).ok
        except (ExecdError, ValueError) as exc:
            log.debug("health of %s at %s: %s", name, address, exc)
            return False

    async def close(self) -> None:
        await self._session.close()
