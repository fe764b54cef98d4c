"""Release, prewarm and checked reuse of released grading pods.

Ordering rules a reader must not break (paper §4.3, §4.4, Table 2 row 3):
* A release and its delete (or its reuse check) are persisted in ONE commit; the delete
  is sent later, once the acquires in flight are answered (``AcquireGate``).
* A released grading pod is reused only after execd reset it and its state check
  passed (restored if needed, ``reuse.py``); anything else retires it (deleted), and so
  does a verdict that contradicts one for the same patch and suite on ANY pod of the job
  (Table A35), or a grading with no verdict.
* Grading prewarm of a tag-referenced image is refused unless the job opted in
  (``sandboxes.imagerefs``, §4.3).
"""

from __future__ import annotations

from sandboxes import events
from sandboxes.controller import queries
from sandboxes.controller.batcher import WriteBatcher
from sandboxes.controller.creates import CreateRunner
from sandboxes.controller.deletes import Deleter
from sandboxes.controller.reuse import ReuseChecker
from sandboxes.controller.runtime import JobRuntime, PrewarmKey, SandboxRef
from sandboxes.controller.runtimes import Runtimes
from sandboxes.controller.state import ControllerState
from sandboxes.controller.tasks import TaskOwner
from sandboxes.imagerefs import tag_refusal
from sandboxes.pool import PoolKey, ReuseDecision, WarmPod, reuse_decision
from sandboxes.services import sandbox_record_event, sandbox_return_for_reuse
from sandboxes.services.batch_deletes import ReleaseRequest
from sandboxes.states import JobState, Role
from sandman_site.errors import ImageNotPinned, InvalidInput, JobNotActive, NotFound

VERDICTS = ("pass", "fail", "none")


class Releaser:
    """Releases (with checked reuse of grading pods) and prewarm targets."""

    def __init__(
        self,
        state: ControllerState,
        tasks: TaskOwner,
        runtimes: Runtimes,
        deleter: Deleter,
        creates: CreateRunner,
        reuse: ReuseChecker,
        batcher: WriteBatcher,
    ) -> None:
        self._batcher = batcher
        self._state = state
        self._tasks = tasks
        self._runtimes = runtimes
        self._deleter = deleter
        self._creates = creates
        self._reuse = reuse

    async def release(
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
        rt = self._runtimes.holding(sandbox_id)
        if rt is None:  # not in our books (e.g. state changed meanwhile): ask the row
            row = await self._tasks.db(queries.sandbox_row, sandbox_id)
            if row is None:
                raise NotFound(f"sandbox {sandbox_id} does not exist")
            rt = await self._runtimes.get(row.job_id)
        may_reuse = verdict is not None and rt.info.reuse_enabled and not rt.pool.draining
        request = ReleaseRequest(
            sandbox_id=sandbox_id,
            now=self._state.now(),
            verdict=verdict,
            patch_sha256=patch_sha256,
            suite=suite,
            keep_grading=may_reuse,
        )
        # Batched with the other releases and hand-outs queued meanwhile (batcher.py).
        sandbox, order, kept = await self._batcher.release(request)
        if kept:
            rt.pool.begin_check(sandbox.pk)
            self._tasks.spawn(
                self._check_for_reuse(rt, sandbox.pk, verdict or "", patch_sha256, suite),
                rt,
                name=f"reuse-check-{sandbox.pk}",
            )
            return
        rt.pool.forget(sandbox.pk)
        rt.refs.pop(sandbox.pk, None)
        if order is not None:
            # Persisted above; sent once the acquires in flight are answered (tasks.py).
            self._tasks.spawn(self._deleter.destroy_later(order), rt, name=f"release-{sandbox.pk}")

    async def prewarm(self, *, job_id: int, keys: list[PrewarmKey]) -> None:
        """Set warm targets per key and start the builds."""
        info = await self._tasks.db(queries.job_info, job_id)
        if info is None:
            raise NotFound(f"job {job_id} does not exist")
        if info.state != JobState.ACTIVE:
            raise JobNotActive(f"job {job_id} is {info.state}; it takes no prewarm")
        for k in keys:
            if not isinstance(k.count, int) or not 0 <= k.count <= info.max_live:
                raise InvalidInput(f"count must be between 0 and max_live ({info.max_live})")
            if k.role not in Role.values:
                raise InvalidInput(f"role must be one of {', '.join(Role.values)}")
            refused = (
                None
                if k.role != Role.GRADING or info.reuse_allow_tags
                else tag_refusal(
                    k.image, k.base_commit or None, backend=self._state.backend, use="warm"
                )
            )
            if refused is not None:
                raise ImageNotPinned(refused, {"image": k.image})
        rt = await self._runtimes.get(job_id, info)
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
        self._creates.fill(rt)

    async def _check_for_reuse(
        self,
        rt: JobRuntime,
        sandbox_id: int,
        verdict: str,
        patch_sha256: str | None,
        suite: str | None,
    ) -> None:
        tasks, now = self._tasks, self._state.now
        row = await tasks.db(queries.sandbox_row, sandbox_id)
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
        if decision.reuse and await tasks.db(
            queries.verdict_contradicted,
            job_id=row.job_id,
            patch_sha256=patch_sha256 or "",
            suite=suite or "",
            verdict=verdict,
        ):
            decision = ReuseDecision(False, "contradiction", decision.verdicts)
        ok, why = (False, decision.reason)
        if decision.reuse:
            started = self._state.clock()
            ok, why = await self._reuse.state_cycle(row.address, row.token)
            took_ms = round((self._state.clock() - started) * 1000, 1)
            await tasks.db(
                sandbox_record_event,
                sandbox_id=sandbox_id,
                kind=events.REUSE_CHECKED,
                now=now(),
                detail={"ok": ok, "reason": why, "duration_ms": took_ms},
            )
        if not ok or rt.pool.draining:
            await tasks.db(
                sandbox_record_event,
                sandbox_id=sandbox_id,
                kind=events.RETIRED,
                now=now(),
                detail={"reason": why or "draining"},
            )
            reason = f"retired:{why or 'draining'}"[:64]
            await self._deleter.delete_sandbox(rt, sandbox_id, reason=reason)
            return
        await tasks.db(
            sandbox_return_for_reuse, sandbox_id=sandbox_id, verdicts=decision.verdicts, now=now()
        )
        key = PoolKey(
            image=row.image,
            base_commit=row.base_commit or None,
            cpu_millis=row.cpu_millis,
            memory_bytes=row.memory_bytes,
            workspace_bytes=row.workspace_bytes,
        )
        rt.refs[sandbox_id] = SandboxRef.of(row)
        since = self._state.clock()
        rt.pool.add_warm(
            WarmPod(sandbox_id=sandbox_id, key=key, since=since, role=row.role, reused=True)
        )
