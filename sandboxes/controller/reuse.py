"""Every execd call the controller makes itself: checked reuse of grading pods.

Health checks go through the provider; this class is the only place the controller talks
to execd directly (``/state/baseline`` after Ready, ``/reset`` + ``/state/check`` +
``/state/restore`` after a release), through ``ExecdClient`` over one shared session that
is opened on the controller's loop at first use and closed at shutdown.

Rules a reader must not break (paper §4.3, Appendix I):
* Any failure of the cycle retires the pod: it is never reused on doubt. An answer of a
  shape ``execd.protocol`` does not declare is such a failure (``bad_answer:<route>[:<field>]``),
  never read with a guessed default.
* A failed baseline does not fail the create (the pod serves once; its check will fail).
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable
from typing import Any

from sandboxes import events
from sandboxes.controller.tasks import TaskOwner
from sandboxes.execd_client import ExecdBadAnswer, ExecdClient, ExecdError, SharedSession
from sandboxes.services import sandbox_record_event

log = logging.getLogger(__name__)


class ReuseChecker:
    """execd's state cycle for checked reuse, over one kept session."""

    def __init__(
        self, tasks: TaskOwner, now: Callable[[], dt.datetime], execd_timeout_s: float
    ) -> None:
        self._tasks = tasks
        self._now = now
        self._timeout_s = execd_timeout_s
        self._session = SharedSession()

    async def take_baseline(self, sandbox_id: int, address: str, token: str) -> None:
        """Record the state a checked-reuse grading pod must return to (before first use)."""
        try:
            report = await (await self._client(address, token)).state_baseline()
            detail: dict[str, Any] = {"ok": True, "files": report.files}
        except (ExecdError, ValueError) as exc:  # the pod still serves once; its check fails
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
        """execd /reset, /state/check and, if it differs, /state/restore (which checks again)."""
        try:
            execd = await self._client(address, token)
            await execd.reset()
            if (await execd.state_check()).clean:
                return True, "clean"
            restore = await execd.state_restore()
            if restore.unrestorable:
                return False, "unrestorable"
            return (True, "restored") if restore.clean else (False, "differs_after_restore")
        except ExecdBadAnswer as exc:  # an undeclared shape: retire, never guess
            log.warning("state check at %s: %s", address, exc)
            return False, f"bad_answer:{exc.route}" + (f":{exc.field}" if exc.field else "")
        except (ExecdError, ValueError) as exc:  # any failure retires the pod
            log.warning("state check at %s failed: %s", address, exc)
            return False, f"check_error:{type(exc).__name__}"

    async def close(self) -> None:
        """Close the kept session (at controller shutdown, on the controller's loop)."""
        await self._session.close()

    async def _client(self, address: str, token: str) -> ExecdClient:
        session = await self._session.get()
        return ExecdClient(address, token, session=session, timeout_s=self._timeout_s)
