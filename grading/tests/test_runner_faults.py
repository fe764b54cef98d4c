"""A grading sandbox destroyed from outside mid-suite (as a node loss or an operator would):
the attempt is an infrastructure failure, retried on a fresh sandbox, then graded — never 0.

The first attempt's suite signals that it runs (a marker file) and then blocks; the test
destroys that sandbox through the local backend, as its pod going away would, while the
runner works in its own thread.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest
from django.db import connection

from grading.models import Grading
from grading.runner import GradingRunner
from grading.tests import harness_support as hs
from grading.tests.support import instance
from sandboxes.models import Sandbox
from sandboxes.providers.base import Handle
from sandboxes.tests.api_support import api
from sandboxes.tests.conftest import local_provider
from sandman_site.errors import ProviderError

pytestmark = pytest.mark.django_db(transaction=True)


def _wait_for(condition, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        threading.Event().wait(0.05)


def test_destroying_the_grading_sandbox_mid_suite_retries_then_grades(
    grading_controller, grading_job, grader, repo, sandbox_root, tmp_path: Path
):
    tmp_path.chmod(0o777)
    marker = tmp_path / "suite-started"
    first = f"touch {marker}; while :; do sleep 0.2; done"
    command = f"if [ ! -e {marker} ]; then {first}; else {hs.PYTEST}; fi"
    body = instance(
        instance_id="calc-kill",
        base_commit=repo.base_commit,
        patch=repo.fix,
        test_patch=repo.test_patch,
        image=repo.image,
        FAIL_TO_PASS=hs.F2P,
        PASS_TO_PASS=hs.P2P,
        suites=[{"name": "unit", "command": command, "time_limit_s": 90}],
    )
    assert api(grader[1]).post("/api/v1/tasks/", body, format="json").status_code == 201
    created = api(grader[1]).post(
        "/api/v1/gradings/",
        {"job": grading_job.pk, "task": "calc-kill", "patch": repo.fix},
        format="json",
    )
    grading_id = created.json()["id"]
    runner = GradingRunner(controller=grading_controller, acquire_timeout_s=60)

    def work() -> None:
        try:
            runner.run_once()
        finally:
            connection.close()  # this thread's own database connection

    worker = threading.Thread(target=work)
    worker.start()
    try:
        _wait_for(marker.exists)
        attempt = Grading.objects.get(pk=grading_id).attempts[-1]
        assert attempt["outcome"] == "running"
        row = Sandbox.objects.get(pk=attempt["sandbox_id"])
        handle = Handle(
            name=row.name,
            nonce=row.nonce,
            backend="local",
            uid=row.backend_uid,
            ref=row.backend_ref,
        )

        async def destroy() -> None:
            provider = local_provider(sandbox_root, isolation="off")
            try:
                await provider.destroy(handle)
            finally:
                await provider.close()

        try:
            asyncio.run(destroy())
        except ProviderError:
            # The runner saw execd go and released the sandbox: the controller's own delete
            # raced ours over the same files. Either way the sandbox is gone.
            assert Sandbox.objects.get(pk=row.pk).state in ("deleting", "deleted")
    finally:
        worker.join(timeout=240)
    assert not worker.is_alive()
    data = api(grader[1]).get(f"/api/v1/gradings/{grading_id}/").json()
    killed, retried = data["attempts"]
    assert killed["outcome"] == "infrastructure", killed
    assert "did not finish" not in killed["detail"]  # the kill ended it, not the time limit
    assert retried["outcome"] == "resolved" and retried["sandbox_id"] != killed["sandbox_id"]
    assert data["verdict"] == "resolved"
