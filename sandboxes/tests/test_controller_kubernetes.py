"""One pool, two providers: the controller's pool tests over ``local`` AND ``kubernetes``.

Each test runs once per backend (``[local]``, ``[kubernetes]``): the same controller,
pool, pacer and database code over the real local provider (execd processes) and over
the real Kubernetes provider talking HTTP to the stand-in cluster (a real execd per
Ready pod). ``backends.py`` hides only how a sandbox is seen on the backend. The last
tests are Kubernetes-only: owner references (anchor or trainer pod) and the anchor's
delete at the end of the drain.
"""

from __future__ import annotations

import datetime as dt
import json
from concurrent.futures import ThreadPoolExecutor
from urllib.error import HTTPError

import pytest

from execd.tokens import derive_token
from sandboxes import events
from sandboxes import labels as L
from sandboxes.controller import PrewarmKey
from sandboxes.models import Acquisition, Job, PendingDelete, Sandbox, SandboxEvent
from sandboxes.services import sandbox_mark_creating, sandbox_request
from sandboxes.tests.controller_support import (
    IMAGE,
    SPEC,
    acquire_args,
    execd,
    kinds,
    make_job,
    state,
    wait_until,
)
from sandboxes.tests.ownership import backends
from sandman_site import errors
from sandman_site.errors import AcquireTimeout, JobNotActive, PoolCapReached, SandmanError
from standin.clock import FakeClock
from standin.harness.support import NS, pod_container
from standin.tests.conftest import core_for

backend = backends.backend  # the fixture: [local] and [kubernetes]


def prewarm_key(count: int = 1, **over) -> PrewarmKey:
    fields = {"image": IMAGE, "base_commit": None, "count": count, **SPEC}
    fields.update(over)
    return PrewarmKey(**fields)


def advance(controller, clock: FakeClock, seconds: float) -> None:
    controller.loop.call_soon_threadsafe(clock.advance, seconds)  # the loop owns the clock


def test_an_acquire_creates_a_sandbox_that_runs_commands_and_release_deletes_it(backend):
    controller = backend.controller()
    job = make_job(egress="deny")
    got = controller.acquire(**acquire_args(job))
    assert got.source == "created" and got.wait_ms >= got.queue_ms >= 0
    assert backend.alive(got.name)
    row = Sandbox.objects.get(pk=got.sandbox_id)
    assert (row.state, row.address, row.backend, row.agent_used) == (
        "in_use",
        got.address,
        backend.name,
        True,
    )
    ran = execd(got.address, got.token, "/exec", {"command": "echo $((6*7)) > a; cat a"})
    assert ran["exit_code"] == 0 and ran["output"].strip() == "42"

    controller.release(sandbox_id=got.sandbox_id, verdict="pass")
    wait_until(lambda: state(got.sandbox_id) == "deleted", what="the released sandbox deleted")
    assert not backend.alive(got.name)
    assert PendingDelete.objects.count() == 0


def test_a_prewarmed_pod_is_handed_out_warm_after_a_health_check_and_replaced(backend):
    controller = backend.controller()
    job = make_job()
    controller.prewarm(job_id=job.pk, keys=[prewarm_key(1)])
    controller.wait_idle()
    warm = Sandbox.objects.get(job=job)
    assert warm.state == "ready" and not warm.agent_used

    got = controller.acquire(**acquire_args(job))
    assert (got.source, got.sandbox_id, got.queue_ms) == ("warm", warm.pk, 0.0)
    timeline = [e.kind for e in SandboxEvent.objects.filter(sandbox=warm).order_by("at", "id")]
    assert timeline.index(events.HEALTHY) < timeline.index(events.ACQUIRED)
    assert execd(got.address, got.token, "/exec", {"command": "true"})["exit_code"] == 0

    controller.wait_idle()  # the replacement started by the hand-out settles
    replacement = Sandbox.objects.exclude(pk=warm.pk).get(job=job)
    assert replacement.state == "ready" and not replacement.agent_used
    assert backend.alive(replacement.name)


def test_a_request_with_another_spec_is_not_handed_the_warm_pod(backend):
    controller = backend.controller()
    job = make_job()
    controller.prewarm(job_id=job.pk, keys=[prewarm_key(1, cpu_millis=250)])
    controller.wait_idle()
    warm = Sandbox.objects.get(job=job)

    got = controller.acquire(**acquire_args(job, cpu_millis=500))
    assert got.source == "created" and got.sandbox_id != warm.pk
    warm.refresh_from_db()
    assert warm.state == "ready" and not warm.agent_used and backend.alive(warm.name)
    assert Sandbox.objects.get(pk=got.sandbox_id).cpu_millis == 500


def test_an_acquire_past_max_live_is_refused_with_pod_cap_and_creates_nothing(backend):
    controller = backend.controller()
    job = make_job(max_live=1)
    first = controller.acquire(**acquire_args(job))
    with pytest.raises(PoolCapReached) as refused:
        controller.acquire(**acquire_args(job))
    assert refused.value.status == 429
    assert list(Sandbox.objects.filter(job=job).values_list("pk", flat=True)) == [first.sandbox_id]
    outcomes = list(Acquisition.objects.filter(job=job).order_by("pk").values_list("outcome"))
    assert outcomes == [("ok",), ("cap",)]


def test_acquire_timeout_keeps_the_late_create_and_it_becomes_warm(backend):
    """Table 2, row 1: the caller gives up (fake clock); the pool keeps the late pod."""
    clock = FakeClock()
    controller = backend.controller(clock=clock.monotonic, sleep=clock.sleep)
    job = make_job()
    hold = backend.hold()
    with ThreadPoolExecutor(max_workers=1) as caller:
        call = caller.submit(controller.acquire, **acquire_args(job, timeout_s=5.0))
        assert hold.wait_reached(), "the create never reached readiness"
        advance(controller, clock, 5.0)
        with pytest.raises(AcquireTimeout):
            call.result(timeout=60)
    late = Sandbox.objects.get(job=job)
    assert late.state == "creating" and Acquisition.objects.get(job=job).outcome == "timeout"
    hold.release()
    controller.wait_idle()
    late.refresh_from_db()
    assert late.state == "ready" and not late.agent_used and backend.alive(late.name)
    assert SandboxEvent.objects.get(sandbox=late, kind=events.WARM).detail["late"] is True

    again = controller.acquire(**acquire_args(job))
    assert (again.source, again.sandbox_id) == ("warm", late.pk)
    assert Sandbox.objects.filter(job=job).count() == 1


def test_drain_deletes_warm_in_use_and_creating_sandboxes_then_the_job_is_drained(backend):
    controller = backend.controller()
    job = make_job()
    in_use = controller.acquire(**acquire_args(job))
    controller.prewarm(job_id=job.pk, keys=[prewarm_key(1)])
    controller.wait_idle()
    warm = Sandbox.objects.get(job=job, state="ready")
    hold = backend.hold()
    controller.prewarm(job_id=job.pk, keys=[prewarm_key(2)])
    assert hold.wait_reached()
    creating = Sandbox.objects.get(job=job, state="creating")
    names = [in_use.name, warm.name, creating.name]

    controller.drain(job_id=job.pk)
    with pytest.raises(JobNotActive):
        controller.acquire(**acquire_args(job))
    wait_until(
        lambda: {state(in_use.sandbox_id), state(warm.pk)} == {"deleted"},
        what="warm and in-use sandboxes deleted by the drain",
    )
    assert state(creating.pk) == "creating" and Job.objects.get(pk=job.pk).state == "draining"
    hold.release()
    controller.wait_idle()
    assert state(creating.pk) == "deleted"
    assert not any(backend.alive(n) for n in names)
    assert Job.objects.get(pk=job.pk).state == "drained"
    assert not backend.anchor_exists(job.pk)
    assert PendingDelete.objects.count() == 0


def test_an_acquire_behind_the_jobs_bucket_waits_in_the_pacer_and_reports_that_wait(backend):
    clock = FakeClock()
    controller = backend.controller(clock=clock.monotonic, sleep=clock.sleep)
    job = make_job(rate_per_s=0.2, burst=1)  # one create now, the next 5 s later
    first = controller.acquire(**acquire_args(job))
    assert first.queue_ms < 5000
    with ThreadPoolExecutor(max_workers=1) as caller:
        call = caller.submit(controller.acquire, **acquire_args(job))
        wait_until(lambda: controller.pacer_queue_length() == 1, what="a create queued")
        assert Sandbox.objects.filter(job=job).count() == 2  # its row precedes the create
        assert not call.done()
        advance(controller, clock, 5.0)
        got = call.result(timeout=60)
    assert got.source == "created" and got.queue_ms >= 5000 and got.wait_ms >= got.queue_ms
    assert Acquisition.objects.get(sandbox_id=got.sandbox_id).queue_ms >= 5000
    assert backend.alive(got.name)


def test_creates_wait_for_the_cluster_bucket_shared_by_every_job(backend):
    """No job bursts past the cluster budget: job B's create queues behind job A's."""
    clock = FakeClock()
    controller = backend.controller(
        clock=clock.monotonic, sleep=clock.sleep, cluster_rate=0.5, cluster_burst=1
    )
    first, second = make_job(name="a"), make_job(name="b")
    got_a = controller.acquire(**acquire_args(first))
    assert got_a.queue_ms < 2000
    with ThreadPoolExecutor(max_workers=1) as caller:
        call = caller.submit(controller.acquire, **acquire_args(second))
        wait_until(lambda: controller.stats()["cluster_queue"] == 1, what="B in the cluster queue")
        assert Sandbox.objects.get(job=second).state == "requested"  # row first, then wait
        assert not call.done()
        advance(controller, clock, 2.0)
        got_b = call.result(timeout=60)
    assert got_b.source == "created" and got_b.queue_ms >= 2000
    assert backend.alive(got_b.name)


def test_a_restarted_controller_adopts_known_sandboxes_and_deletes_the_rest(backend):
    job = make_job()
    first = backend.controller(surviving=True)
    in_use = first.acquire(**acquire_args(job))
    first.prewarm(job_id=job.pk, keys=[prewarm_key(1)])
    first.wait_idle()
    warm = Sandbox.objects.get(job=job, state="ready")
    first.stop()

    stray = backend.ownerless()
    now = dt.datetime.now(dt.UTC)
    orphan = sandbox_request(
        job_id=job.pk, role="rollout", image=IMAGE, base_commit=None, key_hash="0" * 16,
        backend=backend.name, now=now, **SPEC,
    )  # fmt: skip
    sandbox_mark_creating(sandbox_id=orphan.pk, now=now)

    second = backend.controller(surviving=True)  # reconciles in start()
    assert state(in_use.sandbox_id) == "in_use" and state(warm.pk) == "ready"
    adopted = SandboxEvent.objects.filter(kind=events.ADOPTED)
    assert set(adopted.values_list("sandbox_id", flat=True)) == {in_use.sandbox_id, warm.pk}
    ran = execd(in_use.address, in_use.token, "/exec", {"command": "echo still here"})
    assert ran["output"].strip() == "still here"
    assert not backend.alive(stray)
    assert state(orphan.pk) == "deleted"
    assert SandboxEvent.objects.filter(sandbox=orphan, kind=events.BACKEND_GONE).exists()

    again = second.acquire(**acquire_args(job))
    assert (again.source, again.sandbox_id) == ("warm", warm.pk)


def test_a_delete_that_failed_is_persisted_and_resumed_by_the_next_controller(backend):
    """Table 2, row 3: an unconfirmed delete survives a restart in PendingDelete."""
    job = make_job()
    first = backend.controller(failing_deletes=True)
    got = first.acquire(**acquire_args(job))
    first.release(sandbox_id=got.sandbox_id)
    pending = wait_until(
        lambda: PendingDelete.objects.filter(name=got.name, attempts__gte=1).first(),
        what="the failed delete recorded",
    )
    assert pending.sandbox_id == got.sandbox_id and pending.last_error
    assert state(got.sandbox_id) == "deleting" and backend.alive(got.name)
    first.stop()
    assert backend.alive(got.name)

    backend.heal_deletes()
    backend.controller()  # reconciles: the pending delete is resumed
    assert state(got.sandbox_id) == "deleted" and not backend.alive(got.name)
    assert PendingDelete.objects.count() == 0
    assert SandboxEvent.objects.filter(
        sandbox_id=got.sandbox_id, kind=events.DELETE_FAILED
    ).exists()


def test_the_sweep_deletes_an_ownerless_sandbox_reports_counts_and_spares_owned_ones(backend):
    controller = backend.controller()
    job = make_job()
    owned = controller.acquire(**acquire_args(job))
    stray = backend.ownerless()
    wait_until(lambda: backend.alive(stray), what="the ownerless sandbox running")

    report = controller.sweep()
    assert (report["listed"], report["owned"], report["ownerless"], report["deleted"]) == (
        2,
        1,
        1,
        1,
    )
    assert report["names"] == [stray] and not backend.alive(stray)
    assert backend.alive(owned.name) and state(owned.sandbox_id) == "in_use"
    assert PendingDelete.objects.count() == 0
    again = controller.sweep()
    assert (again["listed"], again["ownerless"], again["deleted"]) == (1, 0, 0)


# --- Kubernetes only: owner references ---------------------------------------------------------
@pytest.mark.parametrize("backend", ["kubernetes"], indirect=True)
def test_pods_name_the_jobs_anchor_created_once_and_deleted_after_the_drain(backend):
    controller = backend.controller()
    job = make_job()
    assert not backend.anchor_exists(job.pk)  # nothing is created before the first pod
    got = [controller.acquire(**acquire_args(job)) for _ in range(2)]
    (anchor,) = [
        c for c in backend.cluster.configmaps(NS) if c["metadata"]["name"].endswith(f"-{job.pk}")
    ]
    for result in got:
        (ref,) = backend.cluster.pod(NS, result.name)["metadata"]["ownerReferences"]
        assert (ref["kind"], ref["name"], ref["uid"]) == (
            "ConfigMap",
            anchor["metadata"]["name"],
            anchor["metadata"]["uid"],
        )
    controller.drain(job_id=job.pk)
    wait_until(lambda: Job.objects.get(pk=job.pk).state == "drained", what="the job drained")
    assert not backend.anchor_exists(job.pk)
    assert backend.cluster.pods(NS) == []


@pytest.mark.parametrize("backend", ["kubernetes"], indirect=True)
def test_the_acquired_token_works_and_no_token_or_key_is_in_the_pod(backend):
    """Issue 9 item 2: the acquire answer's token (HMAC of the sandbox's name under the job's
    key) works against the pod's execd, a token for another sandbox name of the same job
    does not, and neither a token nor the job's key is anywhere in the pod's JSON, as the
    stand-in stores it or as the API returns it. The job's Secret goes with the drain."""
    controller = backend.controller()
    job = make_job()
    got = controller.acquire(**acquire_args(job))
    key = Job.objects.get(pk=job.pk).execd_key
    ran = execd(got.address, got.token, "/exec", {"command": "echo ok"})
    assert ran["exit_code"] == 0 and ran["output"].strip() == "ok"
    other = derive_token(key.encode(), f"sm-{job.pk}-someone-else")
    with pytest.raises(HTTPError) as refused:
        execd(got.address, other, "/exec", {"command": "true"})
    assert refused.value.code == 401
    core = core_for(backend.cluster)
    try:
        raw = core.read_namespaced_pod(got.name, NS, _preload_content=False).data.decode()
    finally:
        core.api_client.close()
    for text in (json.dumps(backend.cluster.pod(NS, got.name)), raw):
        assert got.token not in text and key not in text
    assert [s["metadata"]["name"] for s in backend.cluster.secrets(NS)] == [
        f"sandman-job-{job.pk}-execd"
    ]
    controller.drain(job_id=job.pk)
    wait_until(lambda: Job.objects.get(pk=job.pk).state == "drained", what="the job drained")
    assert backend.cluster.secrets(NS) == []


@pytest.mark.parametrize("backend", ["kubernetes"], indirect=True)
def test_the_sweep_deletes_anchors_of_drained_and_unknown_jobs_and_spares_live_ones(backend):
    controller = backend.controller()
    live = make_job()
    controller.acquire(**acquire_args(live))  # its first create makes its anchor
    drained = make_job()
    controller.drain(job_id=drained.pk)
    wait_until(lambda: Job.objects.get(pk=drained.pk).state == "drained", what="drained")
    unknown = Job.objects.order_by("-pk").first().pk + 1000
    labels = {L.MANAGED_BY: L.VALUE_MANAGED_BY}
    core = core_for(backend.cluster)
    try:
        for job_id in (drained.pk, unknown):  # left behind, as by a delete that never landed
            core.create_namespaced_config_map(
                NS,
                {
                    "metadata": {
                        "name": f"sandman-job-{job_id}",
                        "labels": {**labels, L.JOB: str(job_id)},
                    }
                },
            )
        core.create_namespaced_config_map(NS, {"metadata": {"name": "someone-elses"}})
    finally:
        core.api_client.close()

    report = controller.sweep()
    assert {k: v for k, v in report.items() if k.startswith("anchors_")} == {
        "anchors_listed": 3,
        "anchors_stale": 2,
        "anchors_deleted": 2,
        "anchors_failed": 0,
    }
    assert backend.anchor_exists(live.pk)
    assert not backend.anchor_exists(drained.pk) and not backend.anchor_exists(unknown)
    assert "someone-elses" in {c["metadata"]["name"] for c in backend.cluster.configmaps(NS)}
    again = controller.sweep()  # idempotent
    assert (again["anchors_listed"], again["anchors_stale"], again["anchors_deleted"]) == (1, 0, 0)


@pytest.mark.parametrize("backend", ["kubernetes"], indirect=True)
def test_a_trainer_pod_in_the_sandbox_namespace_owns_the_pods_one_elsewhere_does_not(backend):
    """A cross-namespace owner would get every pod garbage-collected at once."""
    trainer = backend.cluster.put_pod(
        NS,
        {
            "metadata": {"name": "trainer-0", "labels": {L.TRAINER: "true"}},
            "spec": {"containers": [pod_container("trainer:1")]},
        },
    )
    controller = backend.controller()
    here = make_job(trainer_pod_name="trainer-0", trainer_pod_uid=trainer["metadata"]["uid"])
    elsewhere = make_job(trainer_pod_name="trainer-1", trainer_pod_uid="uid-in-another-ns")
    got_here = controller.acquire(**acquire_args(here))
    got_elsewhere = controller.acquire(**acquire_args(elsewhere))

    (ref,) = backend.cluster.pod(NS, got_here.name)["metadata"]["ownerReferences"]
    assert (ref["kind"], ref["name"], ref["uid"]) == (
        "Pod",
        "trainer-0",
        trainer["metadata"]["uid"],
    )
    assert not backend.anchor_exists(here.pk)
    (ref,) = backend.cluster.pod(NS, got_elsewhere.name)["metadata"]["ownerReferences"]
    assert (ref["kind"], ref["name"]) == ("ConfigMap", f"sandman-job-{elsewhere.pk}")
    backend.cluster.run_until_idle()  # the stand-in's garbage collector had its chance
    assert backend.alive(got_here.name) and backend.alive(got_elsewhere.name)
    out = execd(got_elsewhere.address, got_elsewhere.token, "/exec", {"command": "echo ok"})
    assert out["output"].strip() == "ok"


@pytest.mark.parametrize("backend", ["kubernetes"], indirect=True)
def test_a_bad_task_image_fails_the_acquire_with_the_kubelets_reason_and_deletes_the_pod(backend):
    """Kubernetes -- Images, "ImagePullBackOff"
    (https://kubernetes.io/docs/concepts/containers/images/#imagepullbackoff): final once
    the kubelet backs off; the trainer reads why, the row keeps it, the pod is deleted."""
    controller = backend.controller()
    job = make_job()
    backend.cluster.plans.add("pod", "bad_image", times=None)
    with pytest.raises(SandmanError) as failed:
        controller.acquire(**acquire_args(job))
    assert "ImagePullBackOff" in str(failed.value)
    (row,) = Sandbox.objects.filter(job=job)
    wait_until(
        lambda: (
            "ImagePullBackOff in container sandbox" in Sandbox.objects.get(pk=row.pk).failure_reason
        ),
        what="the failure recorded with the kubelet's reason",
    )
    wait_until(lambda: backend.cluster.pods(NS) == [], what="the stuck pod deleted")
    # The create was stored but never got Ready: its handle was written alone (the Ready
    # write that usually carries it never came), so the delete went with the UID.
    failed_row = Sandbox.objects.get(pk=row.pk)
    assert failed_row.backend_uid and failed_row.api_created_at is not None


LOSSES = {
    # disruption -> the reason the holder reads
    "evict": "Evicted",  # node-pressure eviction: phase Failed, reason Evicted
    "lose_node": "NotReady",  # the node stops reporting: its pods turn Ready False
    "fail_probe": "NotReady",  # the readiness probe fails: Ready flips back to False
}


def _disrupt(cluster, how: str, name: str) -> None:
    if how == "evict":
        assert cluster.evict_pod(NS, name)
    elif how == "lose_node":
        assert cluster.lose_node(cluster.pod(NS, name)["spec"]["nodeName"]) >= 1
    else:
        assert cluster.fail_probe(NS, name)


def _lost(controller, sandbox_id: int) -> bool:
    controller.run_maintenance()  # the round that reads what the provider saw
    return Sandbox.objects.get(pk=sandbox_id).failure_reason.startswith("lost: ")


@pytest.mark.parametrize("backend", ["kubernetes"], indirect=True)
@pytest.mark.parametrize("how", sorted(LOSSES))
def test_a_lost_in_use_sandbox_is_reported_to_its_holder_on_get_and_on_release(backend, how):
    """Kubernetes -- Node-pressure Eviction; Nodes ("Node status"); readiness probes: an
    in-use sandbox whose pod is evicted, whose node is lost or whose Ready flips back to
    False is failed with the reason (GET shows state, failure_reason and the ``lost``
    event), its release answers 409 ``sandbox_lost``, and its pod is deleted."""
    lost_kind, lost_error = events.LOST, errors.SandboxLost
    controller = backend.controller()
    job = make_job()
    got = controller.acquire(**acquire_args(job))
    _disrupt(backend.cluster, how, got.name)
    wait_until(lambda: _lost(controller, got.sandbox_id), what="the loss recorded")
    row = Sandbox.objects.get(pk=got.sandbox_id)
    assert row.state in ("failed", "deleting", "deleted")
    assert f"lost: {LOSSES[how]}" in row.failure_reason
    assert lost_kind in kinds(got.sandbox_id)
    with pytest.raises(lost_error) as lost:
        controller.release(sandbox_id=got.sandbox_id)
    assert lost.value.status == 409 and LOSSES[how] in str(lost.value)
    wait_until(lambda: not backend.alive(got.name), what="the lost pod deleted")


@pytest.mark.parametrize("backend", ["kubernetes"], indirect=True)
def test_a_loss_the_pod_watch_delivers_is_recorded_at_once_not_at_the_next_round(backend):
    """Kubernetes -- Pod conditions (Ready False: the Pod cannot serve requests,
    https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/#pod-conditions): the
    watch event that shows an in-use pod lost is followed at once by its record (failed,
    ``lost: NotReady``) and its delete, with no maintenance round in between -- so an offer a
    web worker could claim (the direct hand-out has no watch) is withdrawn just as fast."""
    controller = backend.controller(maintenance_interval_s=None)  # no periodic round
    job = make_job()
    got = controller.acquire(**acquire_args(job))
    assert backend.cluster.fail_probe(NS, got.name)
    wait_until(
        lambda: Sandbox.objects.get(pk=got.sandbox_id).failure_reason.startswith("lost: NotReady"),
        what="the loss recorded without a maintenance round",
    )
    assert events.LOST in kinds(got.sandbox_id)
    wait_until(lambda: not backend.alive(got.name), what="the lost pod deleted")


@pytest.mark.parametrize("backend", ["kubernetes"], indirect=True)
def test_a_warm_pod_seen_not_ready_before_any_maintenance_round_is_skipped_not_handed_out(
    backend,
):
    """Kubernetes -- Pod conditions ("Ready: the Pod is able to serve requests",
    https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/#pod-conditions): a warm
    pod whose Ready the kubelet turned False is not handed out even while its execd still
    answers /health and no maintenance round has recorded the loss yet. The acquire gets
    another sandbox; the pod is recorded lost (with the kubelet's reason) and deleted."""
    controller = backend.controller(maintenance_interval_s=None)  # no round in between
    provider = controller.provider
    # Nor the loss's own run (test below): held off, as when an acquire's check comes
    # between the watch's delivery and that run, which is queued on the same loop.
    provider.listen_lost(lambda: None)
    job = make_job()
    controller.prewarm(job_id=job.pk, keys=[prewarm_key(1)])
    controller.wait_idle()
    warm = Sandbox.objects.get(job=job)
    assert backend.cluster.fail_probe(NS, warm.name)
    wait_until(
        lambda: provider.lost_now(warm.name, warm.backend_uid) is not None,
        what="the pod watch delivered Ready False",
    )
    got = controller.acquire(**acquire_args(job))
    assert got.sandbox_id != warm.pk and got.source == "created"
    row = Sandbox.objects.get(pk=warm.pk)
    assert row.failure_reason.startswith("lost: NotReady") and not row.agent_used
    assert events.LOST in kinds(warm.pk) and events.ACQUIRED not in kinds(warm.pk)
    wait_until(lambda: state(warm.pk) == "deleted", what="the lost warm pod deleted")


@pytest.mark.parametrize("backend", ["kubernetes"], indirect=True)
def test_a_warm_sandbox_whose_ready_flips_back_is_deleted_and_never_handed_out(backend):
    lost_kind = events.LOST
    controller = backend.controller()
    job = make_job()
    controller.prewarm(job_id=job.pk, keys=[prewarm_key(1)])
    controller.wait_idle()
    warm = Sandbox.objects.get(job=job)
    _disrupt(backend.cluster, "fail_probe", warm.name)
    wait_until(lambda: _lost(controller, warm.pk), what="the warm loss recorded")
    got = controller.acquire(**acquire_args(job))
    assert got.sandbox_id != warm.pk and lost_kind in kinds(warm.pk)
    wait_until(lambda: state(warm.pk) == "deleted", what="the lost warm pod deleted")
