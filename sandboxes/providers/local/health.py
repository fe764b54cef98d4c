"""The local backend's one way to execd: its ``GET /health`` through the one execd client.

Every execd call of this provider goes through :class:`ExecdHealth`: ``ExecdClient``
(``sandboxes.execd_client``) over one session shared by every sandbox, whose connector
keeps one keep-alive connection per address, so the check before a warm hand-out costs one
request on an open connection instead of a connect (a new connection costs execd a new
thread, and the client a connect).

Rules a reader must not break:
* A check that is given the sandbox's token sends it, and execd answers 401 to a wrong
  one: a dead sandbox's port reused by another sandbox's execd is not healthy.
* A health check answers True or False, never raises: a transport error, a timeout, an
  error status or an answer of a shape ``execd.protocol`` does not declare is False; only
  a declared ``{ok, version, shell_alive}`` answer with ``ok`` true is True.
* A kept connection found closed (execd restarted, the sandbox destroyed and its port
  reused) is replaced once, at once, by the client's one retry of a GET; a POST is never
  sent here.
* The session is opened on the loop that checks and closed by ``close`` on that loop; a
  provider used again on a new loop (a controller restarted) opens a new one there.
"""

from __future__ import annotations

import logging

from sandboxes.execd_client import ExecdClient, ExecdError, SharedSession

log = logging.getLogger(__name__)


class ExecdHealth:
    """execd's ``/health`` per sandbox, over one shared session (of kept connections, unless
    ``keep_connections`` is off)."""

    def __init__(self, timeout_s: float, *, keep_connections: bool = True) -> None:
        """``keep_connections=False``: each check's connection is closed after it (a caller
        that checks each sandbox once; the web workers' claims use the lighter
        ``sandboxes.execd_probe`` for that, and ``bench/local_connect.py`` compares)."""
        self._timeout_s = timeout_s
        self._session = SharedSession() if keep_connections else SharedSession(keepalive_s=None)

    async def check(self, name: str, address: str, token: str = "") -> bool:
        """``token`` (the sandbox's, when the caller has it) makes execd check who answers:
        another sandbox now at a reused address answers 401, so False."""
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
