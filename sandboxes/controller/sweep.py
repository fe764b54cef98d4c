"""The sweep: delete backend sandboxes and anchors that no record owns; report counts.

Rules a reader must not break:
* The backend is listed BEFORE the database is read. A record owns a name from before its
  create is sent until the backend confirms the delete, so the sweep can never race a
  create of ours.
* A per-job anchor (Kubernetes) is deleted when its job is drained or unknown: a job row
  exists before its first anchor is created and is marked drained only after its anchor
  is deleted, so an anchor listed before the database is read belongs to a live job or to
  none.
* A Terminating sandbox (``OwnedSandbox.terminating``: deleted, not gone yet) is never
  ownerless: somebody already deleted it, and a second delete or an incident draft for it
  would be false. It is counted as ``terminating``.
* The sweep is idempotent and returns counts (also kept in ``last_sweep``). What it found
  goes out through :class:`ControllerHooks` (run on a database thread); a hook that raises
  is logged and counted in ``hook_failures``, never silently skipped.
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

from sandboxes.controller import queries
from sandboxes.controller.deletes import Deleter
from sandboxes.controller.hooks import ControllerHooks, run_hook
from sandboxes.controller.state import ControllerState
from sandboxes.controller.tasks import TaskOwner
from sandboxes.providers.base import OwnedSandbox
from sandboxes.services import pending_delete_for_unknown
from sandman_site.errors import ProviderError

log = logging.getLogger(__name__)


class Sweeper:
    """Finds and deletes what nobody owns; tells the hooks what it found."""

    def __init__(
        self, state: ControllerState, tasks: TaskOwner, deleter: Deleter, hooks: ControllerHooks
    ) -> None:
        self._state = state
        self._tasks = tasks
        self._deleter = deleter
        self._hooks = hooks
        self.last_sweep: dict[str, Any] | None = None
        self.hook_failures = 0  # over this controller's life

    async def sweep(self) -> dict[str, Any]:
        """Delete labelled sandboxes that no live record owns; return counts."""
        now = self._state.now()
        owned = await self._state.provider.list_owned()  # listed BEFORE reading the database
        names = [o.name for o in owned]
        with_rows = await self._tasks.db(queries.names_with_rows, names=names, since=now)
        terminating = [o for o in owned if o.terminating and o.name not in with_rows]
        ownerless = [o for o in owned if o.name not in with_rows and not o.terminating]
        deleted, failed = await self._delete_ownerless(ownerless, now)
        report: dict[str, Any] = {
            "listed": len(owned),
            "owned": len(owned) - len(ownerless) - len(terminating),
            "ownerless": len(ownerless),
            "terminating": len(terminating),
            "deleted": deleted,
            "failed": failed,
            "names": [o.name for o in ownerless],
            "at": now.isoformat(),
        }
        report.update(await self._sweep_anchors())
        report["hook_failures"] = await self._report(report["names"], now)
        self.last_sweep = report
        return report

    async def _delete_ownerless(
        self, ownerless: list[OwnedSandbox], now: dt.datetime
    ) -> tuple[int, int]:
        deleted = failed = 0
        for item in ownerless:
            log.warning("sweep: %s carries Sandman's label but no record owns it", item.name)
            order = await self._tasks.db(
                pending_delete_for_unknown,
                name=item.name,
                backend=self._state.backend,
                uid=item.uid,
                nonce=item.nonce,
                ref="",
                reason="sweep_ownerless",
                now=now,
            )
            if await self._deleter.destroy(order):
                deleted += 1
            else:
                failed += 1
        return deleted, failed

    async def _report(self, names: list[str], now: dt.datetime) -> int:
        """Call the hooks (database threads); the number of hooks that raised."""
        hooks, failures = self._hooks, 0
        if names:
            ok = await self._tasks.db(
                run_hook, "ownerless_found", lambda: hooks.ownerless_found(names, now)
            )
            failures += not ok
        ok = await self._tasks.db(run_hook, "after_sweep", lambda: hooks.after_sweep(now))
        failures += not ok
        self.hook_failures += failures
        return failures

    async def _sweep_anchors(self) -> dict[str, int]:
        """Delete anchors whose job is drained or unknown to the database; return counts."""
        provider = self._state.provider
        counts = dict.fromkeys(
            ("anchors_listed", "anchors_stale", "anchors_deleted", "anchors_failed"), 0
        )
        try:
            job_ids = await provider.list_anchors()  # listed BEFORE reading the database
        except ProviderError:
            log.warning("sweep: anchors could not be listed", exc_info=True)
            counts["anchors_failed"] = 1
            return counts
        if not job_ids:  # a backend without anchors (local), or none left
            return counts
        live = await self._tasks.db(queries.jobs_not_drained, job_ids=job_ids)
        stale = [job_id for job_id in job_ids if job_id not in live]
        counts.update(anchors_listed=len(job_ids), anchors_stale=len(stale))
        for job_id in stale:
            log.warning("sweep: the anchor of job %s outlived it", job_id)
            try:
                await provider.delete_anchor(job_id)
            except ProviderError:
                log.warning("sweep: anchor of job %s not deleted", job_id, exc_info=True)
                counts["anchors_failed"] += 1
            else:
                counts["anchors_deleted"] += 1
        return counts
