"""Checked reuse of grading pods (paper §4.3, Appendix I) with real execd state checks."""

from __future__ import annotations

from sandboxes import events
from sandboxes.models import Sandbox, SandboxEvent
from sandboxes.tests.controller_support import (
    acquire_args,
    execd,
    make_job,
    pid_of,
    process_alive,
    state,
    wait_until,
)


def test_a_grading_pod_is_restored_reused_and_retired_when_its_verdicts_contradict(
    controller, sandbox_root
):
    job = make_job(reuse_enabled=True, reuse_max_uses=8)
    first = controller.acquire(**acquire_args(job, role="grading"))
    assert first.source == "created"
    baseline = SandboxEvent.objects.get(sandbox_id=first.sandbox_id, kind=events.STATE_BASELINE)
    assert baseline.detail["ok"] is True
    pid = pid_of(sandbox_root, first.name)
    dirty = execd(first.address, first.token, "/exec", {"command": "echo residue > stray.txt"})
    assert dirty["exit_code"] == 0

    controller.release(
        sandbox_id=first.sandbox_id, verdict="pass", patch_sha256="abc", suite="unit"
    )
    controller.wait_idle()
    row = Sandbox.objects.get(pk=first.sandbox_id)
    assert (row.state, row.reuse_count, row.reuse_verdicts) == ("ready", 1, {"abc:unit": "pass"})
    checked = SandboxEvent.objects.get(sandbox=row, kind=events.REUSE_CHECKED)
    assert checked.detail == {"ok": True, "reason": "restored"}
    assert process_alive(pid)

    rollout = controller.acquire(**acquire_args(job, role="rollout"))
    assert rollout.sandbox_id != row.pk  # a used grading pod never serves a rollout
    second = controller.acquire(**acquire_args(job, role="grading"))
    assert (second.source, second.sandbox_id) == ("reused", row.pk)
    gone = execd(second.address, second.token, "/exec", {"command": "test -e stray.txt"})
    assert gone["exit_code"] == 1  # the residue of the first grading was undone

    controller.release(sandbox_id=row.pk, verdict="fail", patch_sha256="abc", suite="unit")
    wait_until(lambda: state(row.pk) == "deleted", what="the contradicting pod retired")
    retired = SandboxEvent.objects.get(sandbox=row, kind=events.RETIRED)
    assert retired.detail["reason"] == "contradiction"
    assert not process_alive(pid)


def test_a_grading_pod_released_without_a_verdict_is_retired(controller, sandbox_root):
    job = make_job(reuse_enabled=True)
    got = controller.acquire(**acquire_args(job, role="grading"))
    pid = pid_of(sandbox_root, got.name)
    controller.release(sandbox_id=got.sandbox_id, verdict="none")
    wait_until(lambda: state(got.sandbox_id) == "deleted", what="the pod retired")
    retired = SandboxEvent.objects.get(sandbox_id=got.sandbox_id, kind=events.RETIRED)
    assert retired.detail["reason"] == "no_verdict"
    assert not process_alive(pid)
