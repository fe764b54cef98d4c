"""SIGKILL the service in the middle of an acquire burst on the stand-in, start it again
(issue 12, item 5).

The first controller runs in a process of its own (``controller_proc.py``) against the
stand-in cluster, whose kubelet runs a real execd per pod. The test fires a burst of
acquires, releases some of the answered ones with their deletes held at a gate (so
pending deletes exist), and SIGKILLs the process while creates are still in flight. A new
controller over the same database and stand-in must leave:

* no orphan: every Sandman pod in the store has a live row, and every execd process the
  kubelet runs belongs to a pod that still exists;
* every record matching reality: a row that is not ``deleted`` has its pod, a ``deleted``
  row has none, and each in-flight create's row ended ``deleted`` with a reason;
* the killed deletes resumed: no ``PendingDelete`` row is left and their pods are gone;
* every acquisition in flight at the kill (its row opened ``pending`` before the acquire
  changed anything) ended ``failed`` with the reason ``service_restarted``, every answered
  one has its ``ok`` row, and no row is left ``pending``.

``BURST`` is scaled down for CI; ``bench/chaos_burst.py`` runs the 500-acquire version.
"""

from __future__ import annotations

import json
import os
import time
from concurrent.futures import Future
from typing import Any

import pytest

from sandboxes.models import Acquisition, PendingDelete, Sandbox, SandboxEvent
from sandboxes.services.acquisitions import SERVICE_RESTARTED
from sandboxes.states import AcquisitionOutcome, SandboxState
from sandboxes.tests.controller_support import acquire_args, make_job
from sandboxes.tests.ownership.test_restart import Env
from standin import StandinCluster
from standin.harness.support import audit, sandman_pods, wait_until

pytestmark = pytest.mark.timeout(300)

BURST = int(os.environ.get("SANDMAN_CHAOS_BURST", "16"))
RUN_EXECD = os.environ.get("SANDMAN_CHAOS_EXECD", "1") == "1"
NODES = int(os.environ.get("SANDMAN_CHAOS_NODES", "4"))
RESULTS = os.environ.get("SANDMAN_CHAOS_RESULTS")  # bench/chaos_burst.py sets it
RELEASED = 4


def burst_kill_restart(env: Env, burst: int) -> dict[str, Any]:
    """The scenario; returns what it measured (the bench records the same numbers)."""
    job = make_job(egress="deny", rate_per_s=1000.0, burst=burst, max_live=burst + 8)
    first = env.process()
    calls: list[Future[dict[str, Any]]] = [
        first.call("acquire", args=acquire_args(job, timeout_s=120.0)) for _ in range(burst)
    ]

    def answered(n: int) -> list[dict[str, Any]] | None:
        done = [c.result() for c in calls if c.done()]
        ok = [d["result"] for d in done if d["ok"]]
        return ok if len(ok) >= n else None

    doomed = wait_until(lambda: answered(RELEASED), what="answered acquires", deadline_s=120)
    doomed = doomed[:RELEASED]
    for sandbox in doomed:
        env.cluster.gates.add("delete_received", name=sandbox["name"])
        first.call("release", sandbox_id=sandbox["sandbox_id"])
    wait_until(lambda: answered(max(RELEASED, burst // 4)), what="a quarter answered")
    # the next create is stored and held, so the kill surely finds creates in flight (two
    # more acquires make sure one more create comes, even if the burst's are all done)
    held = env.cluster.gates.add("create_stored", name_prefix=f"sm-{job.pk}-")
    calls += [first.call("acquire", args=acquire_args(job)) for _ in range(2)]
    held.wait_reached(120)
    wait_until(
        lambda: (
            PendingDelete.objects.filter(name__in=[d["name"] for d in doomed]).count()
            == len(doomed)
        ),
        what="the released sandboxes' pending deletes",
    )
    started = time.monotonic()
    first.kill()  # mid-burst: creates in flight, deletes held at the gate

    in_flight = list(
        Sandbox.objects.filter(
            job=job, state__in=[SandboxState.REQUESTED, SandboxState.CREATING]
        ).values_list("name", flat=True)
    )
    answered_ok = sum(1 for c in calls if c.done() and c.result()["ok"])
    unanswered = sum(1 for c in calls if not c.done())
    acquiring_at_kill = list(
        Acquisition.objects.filter(job=job, outcome=AcquisitionOutcome.PENDING).values_list(
            "pk", flat=True
        )
    )
    env.cluster.gates.release_all()  # the cluster goes on; only the service died

    restarted = time.monotonic()
    second = env.controller(sweep_interval_s=0.2, maintenance_interval_s=None)
    reconciled = time.monotonic()
    wait_until(lambda: PendingDelete.objects.count() == 0, what="the pending deletes resumed")
    settled = time.monotonic()
    env.cluster.run_until_idle(timeout=60)  # deleted pods' containers stop in their grace
    pods = {p["metadata"]["name"] for p in sandman_pods(env.cluster)}
    rows = dict(Sandbox.objects.filter(job=job).values_list("name", "state"))
    report = audit(env.cluster, second, at="after restart")
    acquisitions = {
        pk: (outcome, detail)
        for pk, outcome, detail in Acquisition.objects.filter(job=job).values_list(
            "pk", "outcome", "detail"
        )
    }
    return {
        "job": job,
        "unanswered_at_kill": unanswered,
        "acquiring_at_kill": acquiring_at_kill,
        "acquisitions": acquisitions,
        "burst": burst,
        "answered_before_kill": answered_ok,
        "in_flight_at_kill": in_flight,
        "doomed": [d["name"] for d in doomed],
        "pods": pods,
        "rows": rows,
        "ownerless": report.ownerless,
        "execd_running": env.cluster.execd.running() if RUN_EXECD else None,  # type: ignore[union-attr]
        "reconcile_s": round(reconciled - restarted, 3),
        "restart_to_settled_s": round(settled - restarted, 3),
        "kill_to_settled_s": round(settled - started, 3),
    }


@pytest.fixture
def env(transactional_db: None, monkeypatch: pytest.MonkeyPatch):
    e = Env()
    e.cluster = StandinCluster(nodes=NODES, run_execd=RUN_EXECD)
    monkeypatch.setenv("SANDMAN_TEST_VERIFY_HEALTH", "1" if RUN_EXECD else "0")
    e.start()
    try:
        yield e
    finally:
        e.stop()


def test_a_service_killed_mid_burst_leaves_no_orphan_and_every_record_true(env: Env) -> None:
    seen = burst_kill_restart(env, BURST)
    rows, pods = seen["rows"], seen["pods"]
    assert seen["in_flight_at_kill"], "the kill came after the burst: nothing was in flight"
    assert seen["ownerless"] == []
    live_rows = {name for name, state in rows.items() if state != SandboxState.DELETED}
    assert pods == live_rows  # a pod for every live row, a live row for every pod
    assert all(rows[name] == SandboxState.DELETED for name in seen["doomed"])
    assert not pods & set(seen["doomed"])
    for name in seen["in_flight_at_kill"]:
        assert rows[name] == SandboxState.DELETED, name
        sandbox = Sandbox.objects.get(name=name)
        reasons = list(SandboxEvent.objects.filter(sandbox=sandbox).values_list("kind", "detail"))
        assert sandbox.failure_reason or reasons, name  # ended with a reason on record
    running = seen["execd_running"]
    if running is not None:  # every execd the kubelet runs belongs to a pod that exists
        running_pods = {key.split(".")[1] for key in running}  # "<namespace>.<pod>.<uid>"
        assert running_pods == pods, (sorted(running), sorted(pods))
    assert PendingDelete.objects.count() == 0
    assert_in_flight_acquisitions_failed_with_a_reason(seen)
    if RESULTS:
        _write_results(seen)


def assert_in_flight_acquisitions_failed_with_a_reason(seen: dict[str, Any]) -> None:
    """Each acquire in flight at the kill has a ``failed`` row saying the service restarted."""
    acquisitions, at_kill = seen["acquisitions"], seen["acquiring_at_kill"]
    assert at_kill, "no acquisition was in flight at the kill"
    assert len(at_kill) <= seen["unanswered_at_kill"]  # each one's caller got no answer
    for pk in at_kill:
        outcome, detail = acquisitions[pk]
        assert outcome == AcquisitionOutcome.FAILED, (pk, outcome, detail)
        assert detail.startswith(f"{SERVICE_RESTARTED}:"), (pk, detail)
    restarted = [pk for pk, (_, d) in acquisitions.items() if d.startswith(SERVICE_RESTARTED)]
    assert sorted(restarted) == sorted(at_kill)  # and no answered acquire was rewritten
    assert not [pk for pk, (o, _) in acquisitions.items() if o == AcquisitionOutcome.PENDING]
    ok = sum(1 for outcome, _ in acquisitions.values() if outcome == AcquisitionOutcome.OK)
    assert ok >= seen["answered_before_kill"]  # every answered acquire is on record


def _write_results(seen: dict[str, Any]) -> None:
    rows = seen["rows"]
    acquisitions = seen["acquisitions"]
    out = {
        "burst": seen["burst"],
        "nodes": NODES,
        "execd_behind_pods": RUN_EXECD,
        "acquires_answered_before_kill": seen["answered_before_kill"],
        "creates_in_flight_at_kill": len(seen["in_flight_at_kill"]),
        "pending_deletes_at_kill": len(seen["doomed"]),
        "acquires_unanswered_at_kill": seen["unanswered_at_kill"],
        "acquisitions_in_flight_at_kill": len(seen["acquiring_at_kill"]),
        "acquisitions_after": {
            o: sum(1 for v, _ in acquisitions.values() if v == o)
            for o in {v for v, _ in acquisitions.values()}
        },
        "acquisitions_failed_service_restarted": sum(
            1 for _, d in acquisitions.values() if d.startswith(SERVICE_RESTARTED)
        ),
        "rows_after": {s: sum(1 for v in rows.values() if v == s) for s in set(rows.values())},
        "pods_after": len(seen["pods"]),
        "ownerless_pods_after": len(seen["ownerless"]),
        "execd_processes_after": None
        if seen["execd_running"] is None
        else len(seen["execd_running"]),
        "reconcile_s": seen["reconcile_s"],
        "restart_to_settled_s": seen["restart_to_settled_s"],
        "kill_to_settled_s": seen["kill_to_settled_s"],
    }
    with open(RESULTS, "w") as handle:
        json.dump(out, handle, indent=2)
