"""SIGKILL the service in the middle of an acquire burst on the LOCAL backend, start it
again (issue 12, item 5).

The first controller runs in a process of its own (``controller_proc.py`` with the local
provider, sandboxes as plain execd process trees under a temp root). The test fires a
burst of acquires and SIGKILLs that process while some are still being created. Every
sandbox dies with the process that started it (``--die-with-parent``); a new controller
over the same database and root must then leave no execd process running, no sandbox
directory, and no row that is not ``deleted`` (each ended with a reason on record); every
acquisition in flight at the kill ends ``failed`` with the reason ``service_restarted``; a
sandbox handed to one of them died too, so a retry with its key finds nothing to answer
(it runs anew) and no sandbox is in use without an ``ok`` acquisition.
This test process is a child subreaper meanwhile, so the killed process's orphans are
reaped here (PID 1 on our machines does not reap).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import tempfile
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandboxes.controller import Controller
from sandboxes.models import Acquisition, Sandbox, SandboxEvent
from sandboxes.providers.local import LocalProvider, procs
from sandboxes.services.acquisitions import SERVICE_RESTARTED
from sandboxes.states import AcquisitionOutcome, SandboxState
from sandboxes.tests.controller_support import acquire_args, make_job
from sandboxes.tests.ownership.test_chaos_burst import (
    assert_cut_hand_outs_claimed_or_taken_back,
    in_use_without_ok_acquisition,
    retry_half_then_reclaim,
)
from sandboxes.tests.ownership.test_restart import ControllerProcess
from standin.harness.support import wait_until

pytestmark = pytest.mark.timeout(300)

BURST = int(os.environ.get("SANDMAN_CHAOS_LOCAL_BURST", "12"))


@contextlib.contextmanager
def subreaper() -> Iterator[None]:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    try:
        yield
    finally:
        libc.prctl(36, 0, 0, 0, 0)
        for pid in procs.zombie_children(os.getpid()):
            os.waitpid(pid, 0)


@pytest.fixture
def local_root(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="sandman-chaos-root-", dir="/tmp"))
    os.chmod(root, 0o711)
    images = Path(tempfile.mkdtemp(prefix="sandman-chaos-images-"))
    monkeypatch.setenv("SANDMAN_TEST_LOCAL_ROOT", str(root))
    monkeypatch.setenv("SANDMAN_TEST_LOCAL_IMAGES", str(images))
    monkeypatch.setenv("SANDMAN_TEST_LOCAL_ISOLATION", "off")
    yield root
    shutil.rmtree(root, ignore_errors=True)
    shutil.rmtree(images, ignore_errors=True)


def test_a_local_service_killed_mid_burst_leaves_no_execd_and_every_record_true(
    transactional_db: None, local_root: Path
) -> None:
    job = make_job(egress="allow", rate_per_s=1000.0, burst=BURST, max_live=BURST + 4)
    provider = LocalProvider(
        root=local_root,
        images_dir=Path(os.environ["SANDMAN_TEST_LOCAL_IMAGES"]),
        isolation_mode="off",
    )
    with subreaper():
        first = ControllerProcess(types.SimpleNamespace(url="unused"))  # type: ignore[arg-type]
        try:
            first.wait_ready()
            calls = [
                first.call("acquire", args=acquire_args(job, idempotency_key=f"c-{i}"))
                for i in range(BURST)
            ]
            wait_until(lambda: any(c.done() for c in calls), what="a first answered acquire")
        finally:
            first.kill()  # mid-burst: the rest are being created
        unanswered = sum(1 for c in calls if not c.done())
        acquiring = set(
            Acquisition.objects.filter(job=job, outcome=AcquisitionOutcome.PENDING).values_list(
                "pk", flat=True
            )
        )
        assert acquiring, "no acquisition was in flight at the kill"
        assert len(acquiring) <= unanswered
        in_flight = list(
            Sandbox.objects.filter(
                job=job, state__in=[SandboxState.REQUESTED, SandboxState.CREATING]
            ).values_list("name", flat=True)
        )
        markers = [
            provider.host_id(name) for name in Sandbox.objects.values_list("name", flat=True)
        ]
        # every sandbox ends with the process that started it
        wait_until(lambda: not any(procs.marked(m) for m in markers), what="the sandboxes to end")
        second = Controller(provider=provider, sweep_interval_s=0, maintenance_interval_s=None)
        second.start()  # reconcile: the exited sandboxes are deleted, their rows ended
        try:
            rows = dict(Sandbox.objects.filter(job=job).values_list("name", "state"))
            assert rows and all(s == SandboxState.DELETED for s in rows.values()), rows
            for name in in_flight:
                sandbox = Sandbox.objects.get(name=name)
                events = SandboxEvent.objects.filter(sandbox=sandbox).count()
                assert sandbox.failure_reason or events, name
            ended = Acquisition.objects.filter(pk__in=acquiring)
            assert {a.outcome for a in ended} == {AcquisitionOutcome.FAILED}
            assert all(a.detail.startswith(f"{SERVICE_RESTARTED}:") for a in ended)
            assert all(a.finished_at is not None for a in ended)
            assert not Acquisition.objects.filter(outcome=AcquisitionOutcome.PENDING).exists()
            assert not any(procs.marked(m) for m in markers)  # no execd left running
            assert [p.name for p in local_root.iterdir() if not p.name.startswith(".")] == []
            # a cut hand-out died with the service: its retry finds nothing to answer, and
            # nothing is in use without an ok acquisition
            seen = {"rows": rows, **retry_half_then_reclaim(second, job)}
            seen["in_use_without_ok_acquisition"] = in_use_without_ok_acquisition(job)
            assert_cut_hand_outs_claimed_or_taken_back(seen, adopted=False)
            again = second.acquire(**acquire_args(job))  # and the service works again
            assert again.source == "created"
            second.release(sandbox_id=again.sandbox_id)
        finally:
            second.stop()
