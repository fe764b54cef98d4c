"""Periodic work: idle trim, lifetime reclaim, delete retries, warm refill, sweep.

Every step is idempotent and returns counts (the sweep also records them in
``last_sweep``). The sweep deletes backend sandboxes carrying Sandman's label that no
record owns; a record owns a name from before its create is sent until the backend
confirms the delete, so the sweep can never race a create of ours. It also deletes
per-job anchors (Kubernetes) whose job is drained or unknown: a job row exists before its
first anchor is created and is marked drained only after its anchor is deleted, so an
anchor listed before the database is read belongs to a live job or to none. Best-effort hooks
into ``incidents`` are called only if that app provides them.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from sandboxes import events
from sandboxes.controller import queries
from sandboxes.controller.runtime import JobRuntime
from sandboxes.services import job_mark_drained, pending_delete_for_unknown
from sandman_site.errors import ProviderError

log = logging.getLogger(__name__)


class MaintenanceMixin:
    """Periodic work of :class:`sandboxes.controller.core.Controller`."""

    async def _maintain(self) -> dict[str, int]:
        if not self.reconciled:
            await self._reconcile()
            self.reconciled = True
        counts = {
            "trimmed": await self._trim_idle(),
            "reclaimed": await self._reclaim_expired(),
            "deletes_retried": await self._retry_deletes(),
            "warm_started": sum(self._fill(rt) for rt in list(self._runtimes.values())),
            "drained": 0,
        }
        for job_id in await self._db(queries.draining_job_ids):
            rt = await self._runtime(job_id)
            if not rt.pool.draining:
                # Drain was asked of an earlier process: carry it on here.
                warm = rt.pool.drain()
                self._spawn(self._drain_job(rt, [p.sandbox_id for p in warm]), rt)
                continue
            counts["drained"] += int(await self._check_drained(rt))
        return counts

    async def _trim_idle(self) -> int:
        deletes = []
        for rt in list(self._runtimes.values()):
            for pod in rt.pool.trim():
                deletes.append(
                    self._spawn(
                        self._delete_sandbox(
                            rt, pod.sandbox_id, reason="idle_trim", kind=events.TRIMMED
                        ),
                        rt,
                    )
                )
        if deletes:
            await asyncio.wait(deletes)
        return len(deletes)

    async def _reclaim_expired(self) -> int:
        """Take back in-use sandboxes held past their job's ``max_lifetime_s``."""
        expired = await self._db(
            queries.expired_in_use, now=self._now(), backend=self.provider.name
        )
        deletes = []
        for row in expired:
            rt = await self._runtime(row.job_id)
            log.info("reclaiming sandbox %s: past its job's max lifetime", row.name)
            deletes.append(
                self._spawn(
                    self._delete_sandbox(rt, row.id, reason="max_lifetime", kind=events.RECLAIMED),
                    rt,
                )
            )
        if deletes:
            await asyncio.wait(deletes)
        return len(deletes)

    async def _retry_deletes(self, *, all_due: bool = False) -> int:
        orders = await self._db(
            queries.pending_deletes_due,
            now=self._now(),
            backend=self.provider.name,
            all_due=all_due,
        )
        orders = [o for o in orders if o.name not in self._destroying]
        if orders:
            await asyncio.gather(*(self._destroy(o) for o in orders))
        return len(orders)

    async def _check_drained(self, rt: JobRuntime) -> bool:
        if rt.drained or not rt.pool.draining or rt.pool.creating or not rt.pool.empty:
            return False
        if await self._db(queries.job_rows_left, job_id=rt.job_id):
            return False
        if not await self._release_owner(rt):  # the job's anchor goes last (ownership.py)
            return False
        await self._db(job_mark_drained, job_id=rt.job_id, now=self._now())
        rt.drained = True
        return True

    # -- the sweep ------------------------------------------------------------------------
    async def _sweep(self) -> dict[str, Any]:
        """Delete labelled sandboxes that no live record owns; return counts."""
        now = self._now()
        owned = await self.provider.list_owned()  # listed BEFORE reading the database
        names = [o.name for o in owned]
        with_rows = await self._db(queries.names_with_rows, names=names, since=now)
        ownerless = [o for o in owned if o.name not in with_rows]
        deleted = failed = 0
        for item in ownerless:
            log.warning("sweep: %s carries Sandman's label but no record owns it", item.name)
            order = await self._db(
                pending_delete_for_unknown,
                name=item.name,
                backend=self.provider.name,
                uid=item.uid,
                nonce=item.nonce,
                ref="",
                reason="sweep_ownerless",
                now=now,
            )
            if await self._destroy(order):
                deleted += 1
            else:
                failed += 1
        report = {
            "listed": len(owned),
            "owned": len(owned) - len(ownerless),
            "ownerless": len(ownerless),
            "deleted": deleted,
            "failed": failed,
            "names": [o.name for o in ownerless],
            "at": now.isoformat(),
        }
        report.update(await self._sweep_anchors())
        self.last_sweep = report
        if ownerless:
            await self._db(_report_ownerless, names=report["names"], now=now)
        await self._db(_run_detectors, now=now)
        return report

    async def _sweep_anchors(self) -> dict[str, int]:
        """Delete anchors whose job is drained or unknown to the database; return counts."""
        counts = dict.fromkeys(
            ("anchors_listed", "anchors_stale", "anchors_deleted", "anchors_failed"), 0
        )
        list_anchors = getattr(self.provider, "list_anchors", None)
        if list_anchors is None:  # a backend without anchors (local)
            return counts
        try:
            job_ids = await list_anchors()  # listed BEFORE reading the database
        except ProviderError:
            log.warning("sweep: anchors could not be listed", exc_info=True)
            counts["anchors_failed"] = 1
            return counts
        live = await self._db(queries.jobs_not_drained, job_ids=job_ids)
        stale = [job_id for job_id in job_ids if job_id not in live]
        counts.update(anchors_listed=len(job_ids), anchors_stale=len(stale))
        for job_id in stale:
            log.warning("sweep: the anchor of job %s outlived it", job_id)
            try:
                await self.provider.delete_anchor(job_id)
            except ProviderError:
                log.warning("sweep: anchor of job %s not deleted", job_id, exc_info=True)
                counts["anchors_failed"] += 1
            else:
                counts["anchors_deleted"] += 1
        return counts


def _report_ownerless(*, names: list[str], now: Any) -> None:
    try:
        from incidents import services as incident_services

        hook = incident_services.ownerless_pods_found
    except (ImportError, AttributeError):
        log.info("incidents.services.ownerless_pods_found is not available; logged only")
        return
    try:
        hook(names=names, now=now)
    except Exception:
        log.exception("incidents.services.ownerless_pods_found failed")


def _run_detectors(*, now: Any) -> None:
    try:
        from incidents import detectors

        run_all = detectors.run_all
    except (ImportError, AttributeError):
        return
    try:
        run_all(now=now)
    except Exception:
        log.exception("incidents.detectors.run_all failed")
