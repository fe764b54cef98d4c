"""Every execd call the controller makes itself: checked reuse of grading pods.

Health checks go through the provider; this class is the only place the controller talks
to execd directly (``/state/baseline`` after Ready, ``/reset`` + ``/state/check`` +
``/state/restore`` after a release), so replacing the HTTP client touches this class only.

Rules a reader must not break (paper §4.3, Appendix I):
* Any failure of the cycle retires the pod: it is never reused on doubt.
* A failed baseline does not fail the create (the pod serves once; its check will fail).
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable
from typing import Any

import aiohttp

from sandboxes import events
from sandboxes.controller.tasks import TaskOwner
from sandboxes.services import sandbox_record_event

log = logging.getLogger(__name__)


class ReuseChecker:
    """execd's state cycle for checked reuse, over one kept aiohttp session."""

    def __init__(
        self, tasks: TaskOwner, now: Callable[[], dt.datetime], execd_timeout_s: float
    ) -> None:
        self._tasks = tasks
        self._now = now
        self._timeout_s = execd_timeout_s
        self._http: aiohttp.ClientSession | None = None

    async def take_baseline(self, sandbox_id: int, address: str, token: str) -> None:
        """Record the state a checked-reuse grading pod must return to (before first use)."""
        try:
            report = await self._post(address, token, "/state/baseline", {})
            detail: dict[str, Any] = {"ok": True, "files": report.get("files")}
        except Exception as exc:  # any failure: the pod still serves once; its check fails
            log.warning("state baseline of sandbox %s failed: %s", sandbox_id, exc)
            detail = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
        await self._tasks.db(
            sandbox_record_event,
            sandbox_id=sandbox_id,
            kind=events.STATE_BASELINE,
            now=self._now(),
            detail=detail,
        )

    async def state_cycle(self, address: str, token: str) -> tuple[bool, str]:
        """execd /reset, /state/check and, if it differs, /state/restore and check again."""
        try:
            await self._post(address, token, "/reset", {})
            check = await self._post(address, token, "/state/check", {})
            if _clean(check):
                return True, "clean"
            restore = await self._post(address, token, "/state/restore", {})
            if restore.get("unrestorable"):
                return False, "unrestorable"
            if "clean" in restore:  # execd checks again after restoring
                return (True, "restored") if restore["clean"] else (False, "differs_after_restore")
            again = await self._post(address, token, "/state/check", {})
            if _clean(again):
                return True, "restored"
            return False, "differs_after_restore"
        except Exception as exc:  # any failure retires the pod: never reuse on doubt
            log.warning("state check at %s failed: %s", address, exc)
            return False, f"check_error:{type(exc).__name__}"

    async def close(self) -> None:
        """Close the kept session (at controller shutdown)."""
        if self._http is not None:
            await self._http.close()
            self._http = None

    async def _post(
        self, address: str, token: str, path: str, body: dict[str, Any]
    ) -> dict[str, Any]:
        if self._http is None:
            self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self._timeout_s))
        async with self._http.post(
            f"http://{address}{path}",
            json=body,
            headers={"Authorization": f"Bearer {token}"},
        ) as response:
            payload = await response.json(content_type=None)
            if response.status != 200:
                raise RuntimeError(f"execd {path} answered {response.status}: {payload}")
            return payload if isinstance(payload, dict) else {}


def _clean(check: dict[str, Any]) -> bool:
    """execd's state check says the pod matches its baseline."""
    if "clean" in check:
        return bool(check["clean"])
    if "ok" in check and "differences" not in check:
        return bool(check["ok"])
    return not check.get("differences")
