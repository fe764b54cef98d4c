"""The probe before every grading (§4.5), through the runner with real sandboxes: a sandbox
whose readings contradict the task's declaration is refused with both values recorded and the
grading moves to another sandbox; an unreadable reading is recorded, never trusted.

``MisconfiguredFirst`` hands the runner the real controller's sandboxes, but changes the
first one's persistent shell as a misconfigured node would have it (``export TZ=...``)
before the runner's probe reads it; every other sandbox is untouched.
"""

from __future__ import annotations

from typing import Any

import pytest

from grading.runner import GradingRunner
from grading.tests import harness_support as hs
from grading.tests.support import instance
from sandboxes.tests.api_support import api

pytestmark = pytest.mark.django_db(transaction=True)


class MisconfiguredFirst:
    """Delegates to a real controller; the first sandbox acquired gets ``command`` run."""

    def __init__(self, controller: Any, command: str) -> None:
        self.controller = controller
        self.command = command
        self.misconfigured: list[int] = []

    def acquire(self, **kwargs: Any) -> Any:
        box = self.controller.acquire(**kwargs)
        if not self.misconfigured:

            async def poison(execd):
                assert (await execd.exec(self.command, timeout_s=30)).exit_code == 0

            hs.with_execd(box.address, box.token, poison)
            self.misconfigured.append(box.sandbox_id)
        return box

    def release(self, **kwargs: Any) -> Any:
        return self.controller.release(**kwargs)


def _readings(sandboxes) -> dict[str, Any]:
    """What a well-configured grading sandbox of this host reads."""
    box = sandboxes("grading")

    async def read(execd):
        return (await execd.probe()).readings

    return hs.with_execd(box.address, box.token, read)


def test_a_contradicting_sandbox_is_refused_and_the_grading_moves_to_another(
    grading_controller, grading_job, grader, repo, sandboxes
):
    zone = _readings(sandboxes)["time_zone"]["value"]
    body = instance(
        instance_id="calc-tz",
        base_commit=repo.base_commit,
        patch=repo.fix,
        test_patch=repo.test_patch,
        image=repo.image,
        FAIL_TO_PASS=hs.F2P,
        PASS_TO_PASS=hs.P2P,
        suites=[{"name": "unit", "command": hs.PYTEST, "time_limit_s": 120}],
        conditions={"time_zone": zone},
    )
    assert api(grader[1]).post("/api/v1/tasks/", body, format="json").status_code == 201
    created = api(grader[1]).post(
        "/api/v1/gradings/",
        {"job": grading_job.pk, "task": "calc-tz", "patch": repo.fix},
        format="json",
    )
    assert created.status_code == 202
    wrapped = MisconfiguredFirst(grading_controller, "export TZ=Pacific/Chatham")
    assert GradingRunner(controller=wrapped, acquire_timeout_s=60).run_once()
    data = api(grader[1]).get(f"/api/v1/gradings/{created.json()['id']}/").json()
    first, second = data["attempts"]
    assert first["sandbox_id"] == wrapped.misconfigured[0] != second["sandbox_id"]
    assert first["outcome"] == "probe_refused"
    [check] = first["checks"]
    assert (check["field"], check["declared"], check["read"], check["outcome"]) == (
        "time_zone",
        zone,
        "Pacific/Chatham",
        "contradiction",
    )
    assert f"declared {zone!r}, read 'Pacific/Chatham'" in first["detail"]
    assert second["outcome"] == "resolved" and second["checks"][0]["outcome"] == "match"
    assert data["verdict"] == "resolved"
