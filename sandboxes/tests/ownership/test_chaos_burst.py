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
  one has its ``ok`` row, and no row is left ``pending``;
* every sandbox handed to an acquire the kill cut (named on its row by the hand-out's own
  transaction) is adopted unclaimed; a retry with the acquire's ``Idempotency-Key`` gets
  THAT sandbox (half are retried), the rest are taken back once the grace is over, and
  after that no sandbox is in use without an ``ok`` acquisition naming it.

``BURST`` is scaled down for CI; ``bench/chaos_burst.py`` runs the 500-acquire version.
"""

from __future__ import annotations

import json
import os
import time
from concurrent.futures import Future
from typing import Any

import pytest
from django.db import connection
from django.db.models import Exists, OuterRef
from django.utils import timezone

from sandboxes.controller import Controller
from sandboxes.models import Acquisition, Job, PendingDelete, Sandbox, SandboxEvent
from sandboxes.services.acquisitions import SERVICE_RESTARTED
from sandboxes.services.recovery import acquisition_recover, sandboxes_unclaimed
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
        first.call("acquire", args=acquire_args(job, timeout_s=120.0, idempotency_key=f"c-{i}"))
        for i in range(burst)
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
    # more acquires make sure one more create comes, even if the burst's are all done).
    # Before the finishes are held: a held finish can stall the controller's database
    # writes behind it, and the create's own rows must be written for it to be sent.
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

    # From here on a hand-out commits but its acquisition's finish waits, so the kill
    # surely cuts hand-outs whose answer never left (two more keyed acquires make sure one
    # more comes, even if the burst's are all done).
    hold_finishes()
    calls += [
        first.call("acquire", args=acquire_args(job, idempotency_key=f"c-late-{i}"))
        for i in range(2)
    ]
    wait_until(
        lambda: Acquisition.objects.filter(
            job=job, outcome=AcquisitionOutcome.PENDING, sandbox__isnull=False
        ).exists(),
        what="a hand-out whose finish is held",
    )
    started = time.monotonic()
    first.kill()  # mid-burst: creates in flight, deletes held at the gate
    release_finishes()  # the dead process's held finishes roll back: its client is gone

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
    # Grace 0: the test itself stands for the time that passes (the services' test holds
    # the bounds); the maintenance round below is the first moment a reclaim may happen.
    second = env.controller(
        sweep_interval_s=0.2, maintenance_interval_s=None, unclaimed_grace_s=0.0
    )
    reconciled = time.monotonic()
    recovery = retry_half_then_reclaim(second, job)
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
        **recovery,
        "in_use_without_ok_acquisition": in_use_without_ok_acquisition(job),
        "reconcile_s": round(reconciled - restarted, 3),
        "restart_to_settled_s": round(settled - restarted, 3),
        "kill_to_settled_s": round(settled - started, 3),
    }


HOLD_LOCK = 4242


def hold_finishes() -> None:
    """Make every acquisition finish (``pending`` -> ``ok``) wait, from now until
    :func:`release_finishes`: a trigger that takes a shared advisory lock this session
    holds exclusively. The link a hand-out writes changes no outcome and goes through."""
    table = Acquisition._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_lock(%s)", [HOLD_LOCK])
        cursor.execute(
            "CREATE OR REPLACE FUNCTION sandman_test_hold_finish() RETURNS trigger AS $$ "
            f"BEGIN PERFORM pg_advisory_xact_lock_shared({HOLD_LOCK}); RETURN NEW; END; "
            "$$ LANGUAGE plpgsql"
        )
        cursor.execute(
            f"CREATE TRIGGER sandman_test_hold_finish BEFORE UPDATE ON {table} FOR EACH ROW "
            "WHEN (OLD.outcome = 'pending' AND NEW.outcome = 'ok') "
            "EXECUTE FUNCTION sandman_test_hold_finish()"
        )


def release_finishes() -> None:
    table = Acquisition._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_unlock_all()")
        cursor.execute(f"DROP TRIGGER IF EXISTS sandman_test_hold_finish ON {table}")
        cursor.execute("DROP FUNCTION IF EXISTS sandman_test_hold_finish()")


def retry_half_then_reclaim(controller: Controller, job: Job) -> dict[str, Any]:
    """Hand-outs the kill cut: half retried with their key (each must get ITS sandbox),
    the rest left to the grace and taken back by the next maintenance round."""
    cut = list(
        Acquisition.objects.filter(
            job=job, detail__startswith=SERVICE_RESTARTED, sandbox__isnull=False
        )
        .order_by("pk")
        .values_list("idempotency_key", "sandbox_id")
    )
    handed = sorted(sandbox_id for _, sandbox_id in cut)
    unclaimed = sandboxes_unclaimed(backend=controller.provider.name)
    sandboxes_before = Sandbox.objects.filter(job=job).count()
    retried = cut[: len(cut) // 2 + len(cut) % 2]
    got = []
    for key, sandbox_id in retried:
        assert key, "every burst acquire carried an Idempotency-Key"
        recovered = acquisition_recover(job_id=job.pk, key=key, now=timezone.now())
        got.append((recovered.sandbox_id if recovered else None, sandbox_id))
    assert Sandbox.objects.filter(job=job).count() == sandboxes_before  # no second sandbox
    counts = controller.run_maintenance()
    return {
        "handed_out_unanswered": handed,
        "unclaimed_after_reconcile": unclaimed,
        "retried": got,
        "taken_back": counts["unclaimed"],
    }


def in_use_without_ok_acquisition(job: Job) -> list[int]:
    ok = Acquisition.objects.filter(sandbox_id=OuterRef("pk"), outcome=AcquisitionOutcome.OK)
    return sorted(
        Sandbox.objects.filter(job=job, state=SandboxState.IN_USE)
        .exclude(Exists(ok))
        .values_list("pk", flat=True)
    )


def assert_cut_hand_outs_claimed_or_taken_back(seen: dict[str, Any], *, adopted: bool) -> None:
    """A sandbox handed to an acquire the kill cut is the retry's, or taken back.

    ``adopted``: the backend's sandboxes outlive the service (the stand-in's pods), so the
    cut hand-outs are adopted in use; a local backend's die with it and are ended at start.
    """
    handed, retried = seen["handed_out_unanswered"], seen["retried"]
    if adopted:
        assert handed, "the kill cut no hand-out: nothing to recover"
        assert seen["unclaimed_after_reconcile"] == handed
        assert [got for got, _ in retried] == [wanted for _, wanted in retried]  # THAT one
        assert seen["taken_back"] == len(handed) - len(retried)
    else:
        assert seen["unclaimed_after_reconcile"] == []
        assert [got for got, _ in retried] == [None] * len(retried)  # gone: a retry runs anew
        assert seen["taken_back"] == 0
    assert seen["in_use_without_ok_acquisition"] == []


@pytest.fixture
def env(transactional_db: None, monkeypatch: pytest.MonkeyPatch):
    e = Env()
    e.cluster = StandinCluster(nodes=NODES, run_execd=RUN_EXECD)
    monkeypatch.setenv("SANDMAN_TEST_VERIFY_HEALTH", "1" if RUN_EXECD else "0")
    e.start()
    try:
        yield e
    finally:
        try:
            release_finishes()
        finally:  # the stand-in and the controller process end whatever the database says
            e.stop()


@pytest.mark.skipif(
    connection.vendor != "postgresql",
    reason="holds acquisitions' finishes with a PostgreSQL trigger and advisory lock",
)
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
    assert_cut_hand_outs_claimed_or_taken_back(seen, adopted=True)
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
        "acquisitions_handed_out_unanswered_at_kill": len(seen["handed_out_unanswered"]),
        "unclaimed_after_reconcile": len(seen["unclaimed_after_reconcile"]),
        "retried_with_key": len(seen["retried"]),
        "retried_with_key_got_their_sandbox": sum(1 for g, w in seen["retried"] if g == w),
        "taken_back_unclaimed_after_grace": seen["taken_back"],
        "in_use_without_ok_acquisition_after": len(seen["in_use_without_ok_acquisition"]),
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
