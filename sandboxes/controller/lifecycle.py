"""Release, delete, drain, prewarm and checked reuse.

Ordering rules a reader must not break (paper §4.4, Table 2 row 3):
* A delete is persisted first (``deleting`` + ``PendingDelete`` in one transaction),
  then sent. A failed send only reschedules it; the row goes only when the backend
  confirms. One destroy per name is in flight at a time.
* ``drain`` stops hand-outs and warm builds at once, deletes warm and in-use pods,
  and lets in-flight creates settle into deletes; the job is ``drained`` only when the
  database holds no undeleted sandbox of it.
* A released grading pod is reused only after execd reset it and its state check
  passed (restored if needed); anything else retires it (deleted).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from sandboxes import events
from sandboxes.controller import queries
from sandboxes.controller.runtime import JobRuntime, PrewarmKey, SandboxRef
from sandboxes.pool import PoolKey, WarmPod, reuse_decision
from sandboxes.providers.base import Handle
from sandboxes.services import (
    DeleteOrder,
    job_mark_draining,
    pending_delete_confirmed,
    pending_delete_failed,
    sandbox_begin_delete,
    sandbox_record_event,
    sandbox_release_and_begin_delete,
    sandbox_return_for_reuse,
)
from sandboxes.states import JobState, Role, SandboxState
from sandman_site.errors import InvalidInput, JobNotActive, NotFound, ProviderConflict

log = logging.getLogger(__name__)
VERDICTS = ("pass", "fail", "none")


class LifecycleMixin:
    """Release/delete/drain/prewarm/reuse of :class:`sandboxes.controller.core.Controller`."""

    # -- deletes ------------------------------------------------------------------------
    async def _delete_sandbox(
        self, rt: JobRuntime | None, sandbox_id: int, *, reason: str, kind: str = ""
    ) -> bool:
        """Persist the delete, then send it. True once the backend confirmed it."""
        if rt is not None:
            rt.pool.forget(sandbox_id)
            rt.refs.pop(sandbox_id, None)
        order = await self._db(
            sandbox_begin_delete, sandbox_id=sandbox_id, reason=reason, now=self._now(), kind=kind
        )
        if order is None:
            return True
        return await self._destroy(order)

    async def _destroy(self, order: DeleteOrder) -> bool:
        task = self._destroying.get(order.name)
        if task is None:
            task = self._spawn(self._destroy_once(order), name=f"destroy-{order.name}")
            self._destroying[order.name] = task
            task.add_done_callback(lambda _t: self._destroying.pop(order.name, None))
        return await asyncio.shield(task)

    async def _destroy_once(self, order: DeleteOrder) -> bool:
        handle = Handle(
            name=order.name, nonce=order.nonce, backend=order.backend, uid=order.uid, ref=order.ref
        )
        try:
            await self._settle(self.provider.destroy(handle))
        except asyncio.CancelledError:
            raise
        except ProviderConflict as exc:
            # The name now holds another workload's sandbox (another nonce): ours is gone
            # and theirs is left alone (Appendix F, window 25).
            log.warning("not deleting %s: %s", order.name, exc)
        except Exception as exc:
            log.warning("delete of %s failed (will retry): %s", order.name, exc, exc_info=True)
            await self._db(
                pending_delete_failed,
                name=order.name,
                error=f"{type(exc).__name__}: {exc}",
                now=self._now(),
            )
            return False
        await self._db(pending_delete_confirmed, name=order.name, now=self._now())
        return True

    # -- release ------------------------------------------------------------------------
    async def _release(
        self,
        *,
        sandbox_id: int,
        verdict: str | None = None,
        patch_sha256: str | None = None,
        suite: str | None = None,
    ) -> None:
        """Release; the delete (or the reuse check) is persisted in the same commit."""
        if verdict is not None and verdict not in VERDICTS:
            raise InvalidInput(f"verdict must be one of {', '.join(VERDICTS)}")
        rt = next((r for r in self._runtimes.values() if sandbox_id in r.pool.in_use), None)
        if rt is None:  # not in our books (e.g. state changed meanwhile): ask the row
            row = await self._db(queries.sandbox_row, sandbox_id)
            if row is None:
                raise NotFound(f"sandbox {sandbox_id} does not exist")
            rt = await self._runtime(row.job_id)
        may_reuse = verdict is not None and rt.info.reuse_enabled and not rt.pool.draining
        sandbox, order, kept = await self._db_now(
            sandbox_release_and_begin_delete,
            sandbox_id=sandbox_id,
            now=self._now(),
            verdict=verdict,
            patch_sha256=patch_sha256,
            suite=suite,
            keep_grading=may_reuse,
        )
        if kept:
            rt.pool.begin_check(sandbox.pk)
            self._spawn(
                self._check_for_reuse(rt, sandbox.pk, verdict or "", patch_sha256, suite),
                rt,
                name=f"reuse-check-{sandbox.pk}",
            )
            return
        rt.pool.forget(sandbox.pk)
        rt.refs.pop(sandbox.pk, None)
        if order is not None:
            # Persisted above; sent once the acquires in flight are answered (tasks.py).
            self._spawn(self._destroy_later(order), rt, name=f"release-{sandbox.pk}")

    async def _destroy_later(self, order: DeleteOrder) -> bool:
        await self._yield_to_acquires()
        return await self._destroy(order)

    # -- drain ----------------------------------------------------------------------------
    async def _drain(self, *, job_id: int) -> None:
        info = await self._db(queries.job_info, job_id)
        if info is None:
            raise NotFound(f"job {job_id} does not exist")
        rt = await self._runtime(job_id, info)
        await self._db(job_mark_draining, job_id=job_id, now=self._now())
        if rt.pool.draining or info.state == JobState.DRAINED:
            return
        warm = rt.pool.drain()
        self._spawn(self._drain_job(rt, [p.sandbox_id for p in warm]), rt, name=f"drain-{job_id}")

    async def _drain_job(self, rt: JobRuntime, warm_ids: list[int]) -> None:
        ids = [*warm_ids, *rt.pool.in_use, *rt.pool.checking]
        deletes = [
            self._spawn(
                self._delete_sandbox(rt, sid, reason="job_draining", kind=events.DRAINED), rt
            )
            for sid in ids
        ]
        in_flight = {t.sandbox_id for t in rt.pool.creating.values()}
        for row in await self._db(queries.rows_of_job, job_id=rt.job_id):
            if row.id in ids or row.id in in_flight or row.state == SandboxState.DELETING:
                continue
            deletes.append(
                self._spawn(
                    self._delete_sandbox(rt, row.id, reason="job_draining", kind=events.DRAINED),
                    rt,
                )
            )
        while rt.pool.creating:  # creates settle into deletes (the pool is draining)
            rt.changed.clear()
            await rt.changed.wait()
        if deletes:
            await asyncio.wait(deletes)
        await self._check_drained(rt)

    # -- prewarm ------------------------------------------------------------------------
    async def _prewarm(self, *, job_id: int, keys: list[PrewarmKey]) -> None:
        info = await self._db(queries.job_info, job_id)
        if info is None:
            raise NotFound(f"job {job_id} does not exist")
        if info.state != JobState.ACTIVE:
            raise JobNotActive(f"job {job_id} is {info.state}; it takes no prewarm")
        for k in keys:
            if not isinstance(k.count, int) or not 0 <= k.count <= info.max_live:
                raise InvalidInput(f"count must be between 0 and max_live ({info.max_live})")
            if k.role not in Role.values:
                raise InvalidInput(f"role must be one of {', '.join(Role.values)}")
        rt = await self._runtime(job_id, info)
        for k in keys:
            key = PoolKey(
                image=k.image,
                base_commit=k.base_commit or None,
                cpu_millis=k.cpu_millis,
                memory_bytes=k.memory_bytes,
                workspace_bytes=k.workspace_bytes,
            )
            rt.pool.set_target(key, k.count)
            rt.key_roles[key] = k.role
        self._fill(rt)

    # -- checked reuse ----------------------------------------------------------------------
    async def _check_for_reuse(
        self,
        rt: JobRuntime,
        sandbox_id: int,
        verdict: str,
        patch_sha256: str | None,
        suite: str | None,
    ) -> None:
        row = await self._db(queries.sandbox_row, sandbox_id)
        if row is None:
            rt.pool.forget(sandbox_id)
            return
        decision = reuse_decision(
            verdict=verdict,
            patch_sha256=patch_sha256,
            suite=suite,
            history=row.reuse_verdicts,
            reuse_count=row.reuse_count,
            max_uses=rt.info.reuse_max_uses,
        )
        ok, why = (False, decision.reason)
        if decision.reuse:
            ok, why = await self._execd_state_cycle(row.address, row.token)
            await self._db(
                sandbox_record_event,
                sandbox_id=sandbox_id,
                kind=events.REUSE_CHECKED,
                now=self._now(),
                detail={"ok": ok, "reason": why},
            )
        if not ok or rt.pool.draining:
            await self._db(
                sandbox_record_event,
                sandbox_id=sandbox_id,
                kind=events.RETIRED,
                now=self._now(),
                detail={"reason": why or "draining"},
            )
            await self._delete_sandbox(rt, sandbox_id, reason=f"retired:{why or 'draining'}"[:64])
            return
        await self._db(
            sandbox_return_for_reuse,
            sandbox_id=sandbox_id,
            verdicts=decision.verdicts,
            now=self._now(),
        )
        key = PoolKey(
            image=row.image,
            base_commit=row.base_commit or None,
            cpu_millis=row.cpu_millis,
            memory_bytes=row.memory_bytes,
            workspace_bytes=row.workspace_bytes,
        )
        rt.refs[sandbox_id] = SandboxRef.of(row)
        rt.pool.add_warm(
            WarmPod(sandbox_id=sandbox_id, key=key, since=self._clock(), role=row.role, reused=True)
        )

    async def _execd_state_cycle(self, address: str, token: str) -> tuple[bool, str]:
        """execd /reset, /state/check and, if it differs, /state/restore and check again."""
        try:
            await self._execd_post(address, token, "/reset", {})
            check = await self._execd_post(address, token, "/state/check", {})
            if _clean(check):
                return True, "clean"
            restore = await self._execd_post(address, token, "/state/restore", {})
            if restore.get("unrestorable"):
                return False, "unrestorable"
            if "clean" in restore:  # execd checks again after restoring
                return (True, "restored") if restore["clean"] else (False, "differs_after_restore")
            again = await self._execd_post(address, token, "/state/check", {})
            if _clean(again):
                return True, "restored"
            return False, "differs_after_restore"
        except Exception as exc:  # any failure retires the pod: never reuse on doubt
            log.warning("state check at %s failed: %s", address, exc)
            return False, f"check_error:{type(exc).__name__}"

    async def _take_baseline(
        self, rt: JobRuntime, sandbox_id: int, address: str, token: str
    ) -> None:
        """Record the state a checked-reuse grading pod must return to (before first use)."""
        try:
            report = await self._execd_post(address, token, "/state/baseline", {})
            detail: dict[str, Any] = {"ok": True, "files": report.get("files")}
        except Exception as exc:  # the pod still serves once; its reuse check will fail
            log.warning("state baseline of sandbox %s failed: %s", sandbox_id, exc)
            detail = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
        await self._db(
            sandbox_record_event,
            sandbox_id=sandbox_id,
            kind=events.STATE_BASELINE,
            now=self._now(),
            detail=detail,
        )

    async def _execd_post(
        self, address: str, token: str, path: str, body: dict[str, Any]
    ) -> dict[str, Any]:
        import aiohttp

        if self._http is None:
            self._http = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.execd_timeout_s)
            )
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
