"""Shadow grading: a verdict graded again on a never-used sandbox, agreement recorded.

Checked reuse compares a sandbox with its own baseline, so a defect present at creation
survives every restore (paper Appendix I); a shadow on a sandbox no tenant touched is the
check on that. The trainer asks for it per grading (``shadow: true``, e.g. a sample).

Rules a reader must not break:
* A shadow runs only after the grading's verdict (resolved / unresolved) is stored, and
  never changes it: it fills ``Grading.shadow`` / ``shadow_agrees`` only.
* Its sandbox is acquired with ``never_used=True`` (a fresh create or a never-used warm
  pod, never a reused one) and released with its own verdict, like any grading, so the
  contradiction rule sees both answers.
* A failure of the shadow's own sandbox (acquire, probe, execd) is recorded as its error,
  with agreement ``None``: it is not a disagreement, and it is not retried.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from grading import services
from grading.conditions import check_conditions, refusal
from grading.harness import HarnessResult, InfrastructureFailure, grade_patch
from grading.models import Grading
from grading.verdicts import Verdict
from sandboxes.execd_client import ExecdClient, ExecdError
from sandman_site.errors import SandmanError

log = logging.getLogger(__name__)
_RELEASE_VERDICT = {Verdict.RESOLVED: "pass", Verdict.UNRESOLVED: "fail"}
SHADOWED = frozenset({Verdict.RESOLVED.value, Verdict.UNRESOLVED.value})


async def _probe_refusal(execd: ExecdClient, conditions: dict[str, Any]) -> str | None:
    readings = dict((await execd.probe()).readings)
    return refusal(check_conditions(conditions, readings))


async def _grade(grading: Grading, address: str, token: str) -> HarnessResult | str:
    """The harness's result, or the probe's refusal sentence."""
    task = grading.task
    try:
        async with ExecdClient(address, token) as execd:
            refused = await _probe_refusal(execd, task.conditions or {})
            if refused is not None:
                return refused
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
    except ExecdError as exc:
        raise InfrastructureFailure(f"execd failed: {exc}") from exc


class ShadowGrader:
    """Grades a decided grading again on a never-used sandbox of the same job and key."""

    def __init__(self, *, controller: Any, acquire_kwargs: dict[str, Any], suite: str) -> None:
        self.controller = controller
        self.acquire_kwargs = acquire_kwargs  # the primary's key, timeout and role
        self.suite = suite  # the name the primary's release reported

    def run(self, grading: Grading) -> None:
        if not grading.shadow_requested or grading.verdict not in SHADOWED:
            return
        started = time.monotonic()
        try:
            box = self.controller.acquire(never_used=True, **self.acquire_kwargs)
        except SandmanError as exc:
            services.grading_shadow_recorded(
                grading=grading, shadow={"error": f"acquire failed: {exc.code}: {exc}"[:500]}
            )
            return
        shadow: dict[str, Any] = {"sandbox_id": box.sandbox_id, "source": box.source}
        release = "none"
        try:
            outcome = asyncio.run(_grade(grading, box.address, box.token))
            if isinstance(outcome, str):
                shadow["error"] = f"probe refused: {outcome}"[:500]
            else:
                shadow["verdict"] = outcome.decision.verdict.value
                shadow["reason"] = outcome.decision.reason[:500]
                release = _RELEASE_VERDICT[outcome.decision.verdict]
        except InfrastructureFailure as exc:
            shadow["error"] = str(exc)[:500]
        finally:
            shadow["duration_ms"] = round((time.monotonic() - started) * 1000, 1)
            services.grading_shadow_recorded(grading=grading, shadow=shadow)
            try:
                self.controller.release(
                    sandbox_id=box.sandbox_id,
                    verdict=release,
                    patch_sha256=grading.patch_sha256,
                    suite=self.suite,
                )
            except SandmanError:  # left to the controller's lifetime reclaim and sweep
                log.warning("shadow of grading %s: release failed", grading.pk, exc_info=True)
