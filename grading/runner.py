"""The grading runner: takes stored gradings and grades them in fresh grading sandboxes.

A collaborator the service process runs beside the controller (one thread, started by the
start-up wiring), never work done inside a request. Rules a reader must not break:
* The database is the queue: a grading is claimed with a lease (``grading_claim``), each
  attempt is stored before its sandbox is used, the verdict when it is known. A restart
  therefore loses nothing: a new runner takes over gradings whose lease ran out and
  records their open attempt ``lost``.
* Every attempt uses its own never-used grading sandbox acquired through the controller
  (role ``grading``), exactly as a trainer would, and releases it with the verdict
  (``none`` after an infrastructure failure, so checked reuse retires it).
* Before every grading the sandbox's ``/probe`` is checked against the task's declared
  conditions (``grading.conditions``); a readable contradiction refuses that sandbox
  (recorded with both values) and the grading moves to another one.
* Only infrastructure failures (``InfrastructureFailure``, a Sandman error from the
  acquire, an unexpected execd answer) and probe refusals are retried; a patch that does
  not apply and failing tests are verdicts.
* A grading that asked for a shadow is graded again on a never-used sandbox after its
  verdict (``grading.shadow``); the shadow never changes the verdict.
* Time is a parameter: ``clock`` gives the datetimes stored; tests drive ``run_once``.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from django.db import close_old_connections

from grading import services
from grading.conditions import check_conditions, refusal
from grading.harness import InfrastructureFailure, grade_patch
from grading.models import Grading
from grading.shadow import ShadowGrader
from grading.verdicts import Verdict
from sandboxes.execd_client import ExecdClient, ExecdError
from sandman_site.errors import SandmanError

log = logging.getLogger(__name__)

DEFAULT_CPU_MILLIS = 1000
DEFAULT_MEMORY_BYTES = 2 * 2**30
_RELEASE_VERDICT = {Verdict.RESOLVED: "pass", Verdict.UNRESOLVED: "fail"}


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class GradingRunner:
    """Claims gradings from the database and runs each attempt in a fresh sandbox."""

    def __init__(
        self,
        *,
        controller: Any,
        clock: Callable[[], dt.datetime] = _utcnow,
        acquire_timeout_s: float = 300.0,
        lease_margin_s: float = 600.0,
        poll_interval_s: float = 1.0,
        name: str | None = None,
        certification_id: int | None = None,
    ) -> None:
        self.controller = controller
        # Only this certification's preflight gradings (``manage.py preflight``), if given.
        self.certification_id = certification_id
        self.clock = clock
        self.acquire_timeout_s = acquire_timeout_s
        self.lease_margin_s = lease_margin_s
        self.poll_interval_s = poll_interval_s
        self.name = name or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- the thread ---------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="sandman-grading", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 30.0) -> bool:
        """Stop after the grading in hand; True once the thread ended (False: still grading
        after ``timeout_s``)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                return False
            self._thread = None
        return True

    def wake(self) -> None:
        """A grading was stored: look now rather than at the next poll."""
        self._wake.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                worked = self.run_once()
            except Exception:  # the loop must outlive one bad grading; it is logged
                log.exception("grading runner: a grading failed outside its attempts")
                worked = False
            finally:
                close_old_connections()
            if not worked:
                self._wake.wait(self.poll_interval_s)
                self._wake.clear()

    # --- one grading ----------------------------------------------------------------------
    def run_once(self) -> bool:
        """Claim one grading and run it to a verdict; False if none was waiting.

        Running certifications are advanced first, so a finished preflight grading's
        successor is queued before the claim looks (``grading.services.certifications``)."""
        services.certification_advance_running(now=self.clock())
        grading = services.grading_claim(
            runner=self.name,
            now=self.clock(),
            lease_s=self._lease_s_for(None),
            certification_id=self.certification_id,
        )
        if grading is None:
            return False
        while self._attempt(grading):
            pass
        ShadowGrader(
            controller=self.controller,
            acquire_kwargs=self._acquire_kwargs(grading),
            suite=_suite_name(grading),
        ).run(grading)
        return True

    def _acquire_kwargs(self, grading: Grading) -> dict[str, Any]:
        task = grading.task
        conditions = task.conditions or {}
        return dict(
            job_id=grading.job_id,
            image=task.image,
            base_commit=task.base_commit,
            cpu_millis=int(conditions.get("cpu_quota_millis", DEFAULT_CPU_MILLIS)),
            memory_bytes=int(conditions.get("memory_limit_bytes", DEFAULT_MEMORY_BYTES)),
            workspace_bytes=None,
            role="grading",
            timeout_s=self.acquire_timeout_s,
        )

    def _lease_s_for(self, grading: Grading | None) -> float:
        limits = sum(float(s["time_limit_s"]) for s in grading.suites) if grading else 0.0
        return self.acquire_timeout_s + limits + self.lease_margin_s

    def _attempt(self, grading: Grading) -> bool:
        """One attempt on a fresh sandbox. True if it failed for infrastructure and another
        attempt is due."""
        started = time.monotonic()
        try:
            box = self.controller.acquire(**self._acquire_kwargs(grading))
        except SandmanError as exc:
            return services.grading_attempt_failed(
                grading=grading, detail=f"acquire failed: {exc.code}: {exc}", now=self.clock()
            )
        services.grading_attempt_start(
            grading=grading,
            sandbox_id=box.sandbox_id,
            source=box.source,
            acquire_ms=round((time.monotonic() - started) * 1000, 1),
            now=self.clock(),
            lease_s=self._lease_s_for(grading),
        )
        verdict = "none"
        try:
            refused = self._probe(grading, box.address, box.token)
            if refused is not None:
                return services.grading_attempt_failed(
                    grading=grading, detail=refused, now=self.clock(), outcome="probe_refused"
                )
            ran = time.monotonic()
            result = asyncio.run(self._grade(grading, box.address, box.token))
            services.grading_decided(
                grading=grading,
                result=result,
                now=self.clock(),
                duration_ms=round((time.monotonic() - ran) * 1000, 1),
            )
            verdict = _RELEASE_VERDICT[result.decision.verdict]
            return False
        except InfrastructureFailure as exc:
            return services.grading_attempt_failed(
                grading=grading, detail=str(exc), now=self.clock()
            )
        finally:
            self._release(box.sandbox_id, verdict, grading)

    async def _read_probe(self, address: str, token: str) -> dict[str, Any]:
        try:
            async with ExecdClient(address, token) as execd:
                return dict((await execd.probe()).readings)
        except ExecdError as exc:
            raise InfrastructureFailure(f"execd failed on /probe: {exc}") from exc

    def _probe(self, grading: Grading, address: str, token: str) -> str | None:
        """Read ``/probe``, record every check on the open attempt; a refusal sentence or None."""
        readings = asyncio.run(self._read_probe(address, token))
        checks = check_conditions(grading.task.conditions or {}, readings)
        services.grading_attempt_probed(
            grading=grading, readings=readings, checks=[c.as_dict() for c in checks]
        )
        return refusal(checks)

    async def _grade(self, grading: Grading, address: str, token: str) -> Any:
        task = grading.task
        try:
            async with ExecdClient(address, token) as execd:
                return await grade_patch(
                    execd,
                    base_commit=task.base_commit,
                    patch=grading.patch,
                    test_patch=task.test_patch,
                    fail_to_pass=task.fail_to_pass,
                    pass_to_pass=task.pass_to_pass,
                    suites=grading.suites,
                    excluded=task.excluded_test_config,
                )
        except ExecdError as exc:  # e.g. closing a client whose sandbox is gone
            raise InfrastructureFailure(f"execd failed: {exc}") from exc

    def _release(self, sandbox_id: int, verdict: str, grading: Grading) -> None:
        try:
            self.controller.release(
                sandbox_id=sandbox_id,
                verdict=verdict,
                patch_sha256=grading.patch_sha256,
                suite=_suite_name(grading),
            )
        except SandmanError:
            # The grading is already stored; a sandbox that cannot be released is left to
            # the controller's lifetime reclaim and sweep.
            log.warning(
                "grading %s: release of sandbox %s failed", grading.pk, sandbox_id, exc_info=True
            )


def _suite_name(grading: Grading) -> str:
    """The suite a release reports. The task is part of it: the same patch (the empty one,
    say) on two tasks is two questions, and checked reuse compares answers to one question."""
    return f"{grading.task.instance_id}:" + "+".join(str(s["name"]) for s in grading.suites)


_runner: GradingRunner | None = None


def set_runner(runner: GradingRunner | None) -> None:
    global _runner
    _runner = runner


def get_runner() -> GradingRunner | None:
    """The process's runner, if the start-up wiring (or a test) installed one."""
    return _runner
