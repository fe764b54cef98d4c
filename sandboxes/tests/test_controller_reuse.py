"""Checked reuse of grading pods (paper §4.3, Appendix I) with real execd state checks."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, cast

import pytest

from sandboxes import events
from sandboxes.controller.reuse import ReuseChecker
from sandboxes.controller.runtime import PrewarmKey, utc_now
from sandboxes.controller.tasks import TaskOwner
from sandboxes.imagerefs import Pinning, image_pinning, tag_refusal
from sandboxes.models import Acquisition, Sandbox, SandboxEvent
from sandboxes.tests.controller_support import (
    IMAGE,
    SPEC,
    acquire_args,
    execd,
    make_job,
    pid_of,
    process_alive,
    state,
    wait_until,
)
from sandman_site.errors import ImageNotPinned

_KEY = dict(base_commit=None, count=1, **SPEC)


def test_a_grading_pod_is_restored_reused_and_retired_when_its_verdicts_contradict(
    controller, sandbox_root
):
    job = make_job(reuse_enabled=True, reuse_max_uses=8, reuse_allow_tags=True)
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
    assert (checked.detail["ok"], checked.detail["reason"]) == (True, "restored")
    assert checked.detail["duration_ms"] > 0
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
    job = make_job(reuse_enabled=True, reuse_allow_tags=True)
    got = controller.acquire(**acquire_args(job, role="grading"))
    pid = pid_of(sandbox_root, got.name)
    controller.release(sandbox_id=got.sandbox_id, verdict="none")
    wait_until(lambda: state(got.sandbox_id) == "deleted", what="the pod retired")
    retired = SandboxEvent.objects.get(sandbox_id=got.sandbox_id, kind=events.RETIRED)
    assert retired.detail["reason"] == "no_verdict"
    assert not process_alive(pid)


def test_a_verdict_that_contradicts_another_pods_verdict_retires_the_pod(controller):
    """Table A35's rule: the same patch and suite answered the other way on ANY pod of the
    job retires the pod (its own history is empty: only the other pod exposes it)."""
    job = make_job(reuse_enabled=True, reuse_allow_tags=True)
    first = controller.acquire(**acquire_args(job, role="grading"))
    second = controller.acquire(**acquire_args(job, role="grading"))
    controller.release(sandbox_id=first.sandbox_id, verdict="pass", patch_sha256="p", suite="t:u")
    wait_until(lambda: state(first.sandbox_id) == "ready", what="the first pod reused")
    # Another patch, or the same patch on another suite, is another question: no contradiction.
    controller.release(sandbox_id=second.sandbox_id, verdict="fail", patch_sha256="p", suite="t:v")
    wait_until(lambda: state(second.sandbox_id) == "ready", what="the second pod reused")

    again = controller.acquire(**acquire_args(job, role="grading"))
    assert again.source == "reused"
    controller.release(sandbox_id=again.sandbox_id, verdict="fail", patch_sha256="p", suite="t:u")
    wait_until(lambda: state(again.sandbox_id) == "deleted", what="the contradicting pod retired")
    retired = SandboxEvent.objects.get(sandbox_id=again.sandbox_id, kind=events.RETIRED)
    assert retired.detail["reason"] == "contradiction"


def test_a_tag_referenced_image_is_refused_for_grading_prewarm_and_reuse_unless_opted_in(
    controller,
):
    """§4.3: only a digest fixes the image a warm or reused grading pod serves."""
    job = make_job(reuse_enabled=True)
    with pytest.raises(ImageNotPinned, match="referenced by tag") as refused:
        controller.acquire(**acquire_args(job, role="grading"))
    assert "allow_tag_images" in str(refused.value) and refused.value.status == 409
    assert not Acquisition.objects.filter(job=job).exists()  # nothing stored
    with pytest.raises(ImageNotPinned, match="warm grading sandbox"):
        controller.prewarm(job_id=job.pk, keys=[PrewarmKey(image=IMAGE, role="grading", **_KEY)])
    # A rollout is not keyed for reuse; a job that opts in takes the tag.
    assert controller.acquire(**acquire_args(job, role="rollout")).source == "created"
    opted = make_job(reuse_enabled=True, reuse_allow_tags=True)
    controller.prewarm(job_id=opted.pk, keys=[PrewarmKey(image=IMAGE, role="grading", **_KEY)])
    assert controller.acquire(**acquire_args(opted, role="grading")).sandbox_id


def test_only_a_digest_or_a_local_image_at_a_full_commit_is_pinned():
    digest = "registry.example/swe/django@sha256:" + "ab" * 32
    commit = "0123456789abcdef0123456789abcdef01234567"
    assert image_pinning(digest, None, backend="kubernetes") == Pinning(True, "digest")
    assert image_pinning("swe/django:v1", commit, backend="kubernetes") == Pinning(False, "tag")
    assert image_pinning("swe/django", commit, backend="local") == Pinning(True, "commit")
    assert image_pinning("sandman/empty", None, backend="local").pinned is False
    assert image_pinning("swe/django", "0123abc", backend="local").pinned is False
    assert tag_refusal(digest, None, backend="kubernetes", use="reused") is None


# --- answers of undeclared shapes retire the pod ---------------------------------------------


class _StateAnswers(BaseHTTPRequestHandler):
    """execd's state routes answering the (status, body) in ``answers`` (set per server)."""

    protocol_version = "HTTP/1.1"
    answers: dict[str, dict[str, Any]] = {}

    def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        data = json.dumps(self.answers[self.path]).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass


_RESET = {"killed": [], "survivors": [], "shell_alive": True, "duration_ms": 1.0}
_DIRTY = {"clean": False, "differences": [{"kind": "file", "change": "added"}], "duration_ms": 1}


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("answers", "expected"),
    [
        # the old shapes the controller used to accept: now undeclared, so the pod retires
        ({"/state/check": {"ok": True}}, (False, "bad_answer:POST /state/check:clean")),
        ({"/state/check": {"differences": []}}, (False, "bad_answer:POST /state/check:clean")),
        (
            {"/state/check": _DIRTY, "/state/restore": {"restored": [], "unrestorable": []}},
            (False, "bad_answer:POST /state/restore:clean"),
        ),
        # declared answers
        ({"/state/check": {"clean": True, "differences": [], "duration_ms": 1}}, (True, "clean")),
        (
            {
                "/state/check": _DIRTY,
                "/state/restore": {
                    "restored": [{"kind": "file"}],
                    "unrestorable": [],
                    "clean": True,
                    "remaining": [],
                    "duration_ms": 1,
                },
            },
            (True, "restored"),
        ),
    ],
)
async def test_the_state_cycle_retires_a_pod_whose_answers_have_an_undeclared_shape(
    answers: dict[str, dict[str, Any]], expected: tuple[bool, str]
) -> None:
    handler = type("Handler", (_StateAnswers,), {"answers": {"/reset": _RESET, **answers}})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    checker = ReuseChecker(cast(TaskOwner, None), utc_now, execd_timeout_s=10)
    try:
        address = f"127.0.0.1:{server.server_address[1]}"
        assert await checker.state_cycle(address, "token") == expected
    finally:
        await checker.close()
        server.shutdown()
        server.server_close()
        thread.join()
