"""The Kubernetes provider against the stand-in over real HTTP (the official client, unpatched).

The auditor in these tests is the stand-in's own pod store (``cluster.pods()``), read
independently of the client under test. A pod "without an owner" is one in the store that
is neither held by a handle the test has, nor in the provider's pending-delete set, nor
the sentinel of another tenant (paper Appendix F, Table A21).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import sys
import types
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest
from kubernetes import client

from sandboxes import labels as L
from sandboxes.providers.base import Handle, Provider
from sandboxes.providers.kubernetes import (
    KubernetesConfig,
    KubernetesProvider,
    PendingDelete,
    boot_command,
    build_pod_manifest,
    carrier_command,
)
from sandboxes.tests.providers.conftest import JOB_KEY, NS, spec
from sandman_site.errors import (
    ProviderAmbiguous,
    ProviderConflict,
    ProviderError,
    ProviderForbidden,
    SandboxNotReady,
)
from standin import AddressModel, StandinCluster

REPO = Path(__file__).resolve().parents[3]
MakeCluster = Callable[..., StandinCluster]
MakeProvider = Callable[..., KubernetesProvider]


def unowned(
    cluster: StandinCluster, provider: KubernetesProvider, *held: Handle, sentinel: str = ""
) -> list[str]:
    """Names of pods in the store that nobody can still delete."""
    owned = {h.name for h in held} | {p.name for p in provider.pending_deletes()} | {sentinel}
    return [p["metadata"]["name"] for p in cluster.pods(NS) if p["metadata"]["name"] not in owned]


def counts(cluster: StandinCluster, verb: str) -> int:
    return cluster.request_counts()[(verb, "pods")]


# --- the manifest ---------------------------------------------------------------------------
def test_pod_manifest_carries_the_security_fields() -> None:
    pod = build_pod_manifest(spec("sb-1"), KubernetesConfig())
    assert pod.spec.automount_service_account_token is False
    assert pod.spec.enable_service_links is False
    assert pod.spec.restart_policy == "Never"
    assert pod.spec.security_context.seccomp_profile.type == "RuntimeDefault"
    for container in pod.spec.init_containers + pod.spec.containers:
        sc = container.security_context
        assert sc.allow_privilege_escalation is False
        assert "NET_RAW" in sc.capabilities.drop
        assert sc.seccomp_profile.type == "RuntimeDefault"
    (tsc,) = pod.spec.topology_spread_constraints
    assert (tsc.max_skew, tsc.when_unsatisfiable, tsc.topology_key) == (
        2,
        "ScheduleAnyway",
        "kubernetes.io/hostname",
    )
    assert tsc.label_selector.match_labels[L.JOB] == "7"
    main = pod.spec.containers[0]
    assert (main.readiness_probe.http_get.path, main.readiness_probe.http_get.port) == (
        "/health",
        8700,
    )
    strict = build_pod_manifest(spec("sb-1"), KubernetesConfig(drop_all_capabilities=True))
    assert strict.spec.containers[0].security_context.capabilities.drop == ["ALL"]


def test_pod_manifest_requests_equal_limits() -> None:
    pod = build_pod_manifest(
        spec("sb-1", cpu_millis=2000, memory_bytes=8 * 2**30, workspace_bytes=10 * 2**30),
        KubernetesConfig(),
    )
    res = pod.spec.containers[0].resources
    assert (
        res.requests
        == res.limits
        == {"cpu": "2000m", "memory": str(8 * 2**30), "ephemeral-storage": str(10 * 2**30)}
    )
    carrier = pod.spec.init_containers[0].resources
    assert carrier.requests == carrier.limits
    assert (
        "ephemeral-storage"
        not in build_pod_manifest(spec("sb-2"), KubernetesConfig())
        .spec.containers[0]
        .resources.limits
    )


def test_pod_manifest_labels_nonce_owner_and_read_only_execd() -> None:
    from sandboxes.providers.base import OwnerRef

    owner = OwnerRef(kind="Pod", name="trainer-0", uid="uid-trainer")
    pod = build_pod_manifest(
        spec("sb-1", owner=owner, labels=(("team", "rl"),)), KubernetesConfig(namespace="x")
    )
    meta = pod.metadata
    assert meta.name == "sb-1" and meta.namespace == "x"
    assert meta.annotations == {L.NONCE_ANNOTATION: "nonce-sb-1"}
    assert meta.labels == {
        "team": "rl",
        L.MANAGED_BY: L.VALUE_MANAGED_BY,
        L.JOB: "7",
        L.ROLE: "rollout",
        L.KEY: "k" * 16,
        L.SANDBOX: "sb-1",
        L.EGRESS: "deny",
    }
    (ref,) = meta.owner_references
    assert (ref.kind, ref.name, ref.uid, ref.controller) == (
        "Pod",
        "trainer-0",
        "uid-trainer",
        False,
    )
    mounts = {m.name: m for m in pod.spec.containers[0].volume_mounts}
    assert mounts["execd"].read_only is True and mounts["execd"].mount_path == "/opt/sandman"
    assert pod.spec.init_containers[0].image == KubernetesConfig().carrier_image


def test_the_jobs_startup_script_reaches_execd_through_the_downward_api() -> None:
    """The script rides in the pod's own annotation, which a downwardAPI volume projects as
    a file (https://kubernetes.io/docs/concepts/workloads/pods/downward-api/: a volume
    item's fieldRef may name ``metadata.annotations['<KEY>']``); execd reads that file."""
    script = "source /opt/conda/bin/activate testbed\n"
    pod = build_pod_manifest(spec("sb-1", startup_script=script), KubernetesConfig())
    assert pod.metadata.annotations[L.STARTUP_ANNOTATION] == script
    (volume,) = [v for v in pod.spec.volumes if v.name == "sandman-startup"]
    (item,) = volume.downward_api.items
    assert item.path == "startup.sh"
    assert item.field_ref.field_path == f"metadata.annotations['{L.STARTUP_ANNOTATION}']"
    main = pod.spec.containers[0]
    mounts = {m.name: m for m in main.volume_mounts}
    assert mounts["sandman-startup"].read_only is True
    path = mounts["sandman-startup"].mount_path + "/startup.sh"
    assert f"--startup-file {path}" in main.command[2]
    plain = build_pod_manifest(spec("sb-2"), KubernetesConfig())
    assert L.STARTUP_ANNOTATION not in plain.metadata.annotations
    assert "sandman-startup" not in {v.name for v in plain.spec.volumes}


def test_no_token_and_no_key_is_in_the_pod_manifest() -> None:
    """The pod names its job's Secret; only the init container mounts it; the main
    container's env is the downward API's pod name and IP, nothing secret."""
    one = spec("sb-1")
    pod = build_pod_manifest(one, KubernetesConfig())
    text = json.dumps(client.ApiClient().sanitize_for_serialization(pod))
    assert one.token not in text and JOB_KEY not in text
    main, carrier = pod.spec.containers[0], pod.spec.init_containers[0]
    assert [(e.name, e.value, e.value_from.field_ref.field_path) for e in main.env] == [
        ("POD_NAME", None, "metadata.name"),
        ("POD_IP", None, "status.podIP"),
    ]
    (volume,) = [v for v in pod.spec.volumes if v.secret is not None]
    assert (volume.secret.secret_name, volume.secret.default_mode) == ("sandman-job-7-execd", 0o444)
    assert volume.name not in {m.name for m in main.volume_mounts}
    (mount,) = [m for m in carrier.volume_mounts if m.name == volume.name]
    assert mount.read_only is True
    assert carrier_command(KubernetesConfig()).endswith(
        f"cp {mount.mount_path}/key /var/run/sandman/key"
    )
    boot = main.command[2]
    assert "--token-key-file /var/run/sandman/key" in boot and "--unlink-token-file" in boot
    assert 'name="${POD_NAME:?}"' in boot and '--token-name "$name"' in boot
    assert "--port 8700" in boot
    assert 'ip="${POD_IP:?}"' in boot  # the pod's IP, where the probe and trainers go
    assert '--host "$ip"' in boot and "--startup-file" not in boot


def test_boot_command_starts_execd_on_the_pod_ip_with_its_name_and_the_key_file(
    tmp_path: Path,
) -> None:
    """Run the real boot shell with a stand-in ``python3`` that records what execd would get."""
    bin_dir, run_dir = tmp_path / "bin", tmp_path / "run"
    bin_dir.mkdir()
    run_dir.mkdir()
    fake = bin_dir / "python3"
    fake.write_text(f'#!/bin/sh\nenv > {tmp_path}/env.txt\necho "$@" > {tmp_path}/argv.txt\n')
    fake.chmod(0o755)
    config = KubernetesConfig(token_dir=str(run_dir), carrier_path=str(tmp_path / "carrier"))
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "PYTHONPATH": "/testbed/src",  # the task image's own, a run condition
        "POD_IP": "127.9.8.7",  # from the downward API on a kubelet
        "POD_NAME": "sb-1",
    }
    subprocess.run(["sh", "-c", boot_command(config)], env=env, check=True, timeout=30)
    seen_env = (tmp_path / "env.txt").read_text()
    assert "PYTHONPATH=/testbed/src\n" in seen_env
    assert "POD_IP" not in seen_env and "POD_NAME" not in seen_env  # Sandman's, not the commands'
    argv = (tmp_path / "argv.txt").read_text()
    assert f"--token-key-file {run_dir}/key --token-name sb-1" in argv
    assert str(tmp_path / "carrier") in argv and "--host 127.9.8.7 --port 8700" in argv
    missing = subprocess.run(
        ["sh", "-c", boot_command(config)], env={**env, "POD_NAME": ""}, timeout=30
    )
    assert missing.returncode != 0  # no name, no token: the boot stops


def test_the_launcher_runs_execd_from_the_carrier_without_pythonpath(tmp_path: Path) -> None:
    """The real python3 and a stand-in ``execd`` package in a carrier directory."""
    from sandboxes.providers.kubernetes import execd_launcher

    package = tmp_path / "carrier" / "execd"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "__main__.py").write_text(
        "import os, sys\nprint(repr(sys.argv[1:]), os.environ.get('PYTHONPATH'))\n"
    )
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": "/testbed/src"}
    done = subprocess.run(
        [sys.executable, "-I", "-c", execd_launcher(str(tmp_path / "carrier")), "--port", "8700"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    assert done.stdout.strip() == "['--port', '8700'] /testbed/src"


# --- readiness through one watch ------------------------------------------------------------
@pytest.mark.asyncio
async def test_twenty_pods_become_ready_through_one_watch_without_polling(
    make_cluster: MakeCluster, make_provider: MakeProvider
) -> None:
    cluster = make_cluster(nodes=4)
    provider = make_provider(cluster)
    assert isinstance(provider, Provider)
    handles = await asyncio.gather(*(provider.create(spec(f"sb-{i:02d}")) for i in range(20)))
    infos = await asyncio.gather(*(provider.wait_ready(h, 30) for h in handles))
    assert all(info.address.endswith(":8700") and info.node for info in infos)
    assert counts(cluster, "watch") == 1 and counts(cluster, "list") == 1
    assert counts(cluster, "get") == 0 and counts(cluster, "create") == 20
    assert provider.informer is not None and provider.informer.watches == 1
    await asyncio.gather(*(provider.destroy(h) for h in handles))
    assert cluster.pods(NS) == []


@pytest.mark.asyncio
async def test_ready_info_reports_node_timeline_and_the_image_cache(
    make_cluster: MakeCluster, make_provider: MakeProvider
) -> None:
    cluster = make_cluster(nodes=1)
    provider = make_provider(cluster)
    first = await provider.wait_ready(await provider.create(spec("first")), 30)
    second = await provider.wait_ready(await provider.create(spec("second")), 30)
    pod = cluster.pod(NS, "first")
    assert first.address == f"{pod['status']['podIP']}:8700" and first.node == "node-0"
    assert first.image_present is False and first.pull_ms and first.pull_ms > 0
    assert second.image_present is True and second.pull_ms == 0
    order = ["api_created", "scheduled", "address_assigned", "image_pulled", "started", "ready"]
    assert list(first.timeline) == order
    stamps = [first.timeline[k] for k in order]
    assert stamps == sorted(stamps) and all(t.tzinfo is not None for t in stamps)
    assert first.address_failures == 0
    assert first.guards["seccomp"] == "RuntimeDefault" and first.guards["egress"] == "deny"


@pytest.mark.asyncio
async def test_address_failures_come_from_the_cnis_events_through_one_event_watch(
    make_cluster: MakeCluster, make_provider: MakeProvider
) -> None:
    """Kubernetes API Reference -- Event v1 core
    (https://kubernetes.io/docs/reference/kubernetes-api/cluster-resources/event-v1/): the
    CNI's "failed to assign an IP address to container" arrives as kubelet
    ``FailedCreatePodSandBox`` Events, aggregated (``count``) and combined when similar."""
    cluster = make_cluster(nodes=1, seed=3, address_model=AddressModel(0, slope=0.3, max_p=0.8))
    provider = make_provider(cluster)
    handles = await asyncio.gather(*(provider.create(spec(f"af-{i}")) for i in range(6)))
    infos = await asyncio.gather(*(provider.wait_ready(h, 60) for h in handles))
    by_pod = cluster.address_failures()["by_pod"]
    assert sum(by_pod.values()) > 0
    assert [i.address_failures for i in infos] == [by_pod.get(h.name, 0) for h in handles]
    requests = cluster.request_counts()
    assert requests[("list", "events")] == 1 and requests[("watch", "events")] == 1


@pytest.mark.asyncio
async def test_a_pod_whose_events_expired_reports_unknown_not_zero(
    make_cluster: MakeCluster, make_provider: MakeProvider
) -> None:
    """kube-apiserver ``--event-ttl`` (default 1h): Events of a pod that became Ready long
    ago are gone (https://kubernetes.io/docs/reference/command-line-tools-reference/kube-apiserver/);
    what only they told is unknown (None), never 0 or False."""
    cluster = make_cluster(nodes=1, mode="manual")
    provider = make_provider(cluster, events_grace_s=0.05)
    body = provider.api_client.sanitize_for_serialization(
        build_pod_manifest(spec("old"), provider.config)
    )
    stored = cluster.put_pod(NS, body)
    cluster.run_until_idle()
    cluster.advance(2 * 3600.0)
    handle = Handle("old", spec("old").nonce, "kubernetes", stored["metadata"]["uid"])
    info = await provider.wait_ready(handle, 30)
    assert info.node == "node-0" and "ready" in info.timeline
    assert (info.image_present, info.pull_ms, info.address_failures) == (None, None, None)
    assert "image_pulled" not in info.timeline


@pytest.mark.asyncio
async def test_the_informer_relists_after_410_and_keeps_resolving(
    make_cluster: MakeCluster, make_provider: MakeProvider
) -> None:
    cluster = make_cluster(nodes=2)
    provider = make_provider(cluster)
    await provider.wait_ready(await provider.create(spec("a")), 30)
    gate = cluster.gates.add("watch_received")
    cluster.close_watches()  # the informer reconnects from its last version ...
    await gate.reached(timeout=10)  # ... and is held there while history moves on
    b = await provider.create(spec("b"))
    cluster.compact_history()
    gate.release()
    info = await provider.wait_ready(b, 30)
    assert info.address
    assert provider.informer is not None and provider.informer.relists_after_gone == 1
    assert counts(cluster, "list") == 2 and counts(cluster, "get") == 0


@pytest.mark.asyncio
async def test_an_expired_watch_is_watched_again_from_its_last_version_and_never_relisted(
    make_cluster: MakeCluster, make_provider: MakeProvider
) -> None:
    """A watch ends when its ``timeoutSeconds`` run out; the client then watches again from
    the last ``resourceVersion`` it saw, without a new list (Kubernetes API Concepts,
    "Efficient detection of changes":
    https://kubernetes.io/docs/reference/using-api/api-concepts/#efficient-detection-of-changes).
    One reconnect per expiry: two expiries are three watches on ONE list."""
    cluster = make_cluster(nodes=2)
    provider = make_provider(cluster, watch_timeout_s=1)
    # One gate per pod watch, claimed in order: each expiry's reconnect is held in turn.
    gates = [cluster.gates.add("watch_received", lambda ctx: ctx.kind == "pods") for _ in "123"]
    created = asyncio.ensure_future(provider.create(spec("a")))
    for n, gate in enumerate(gates, start=1):
        await gate.reached(timeout=30)  # watch n (n - 1 expiries so far)
        assert provider.informer is not None
        assert (provider.informer.watches, provider.informer.lists) == (n, 1)
        assert counts(cluster, "watch") == n and counts(cluster, "list") == 1
        gate.release()
        if n == 1:
            await provider.wait_ready(await created, 30)
    info = await provider.wait_ready(await provider.create(spec("b")), 30)
    assert info.address  # the third watch, from the last version, delivered b's Ready
    assert provider.informer is not None and provider.informer.relists_after_gone == 0
    assert counts(cluster, "list") == 1


@pytest.mark.asyncio
async def test_an_expired_events_watch_is_watched_again_from_its_last_version_too(
    make_cluster: MakeCluster, make_provider: MakeProvider
) -> None:
    """The namespace's Events watch follows the same rule as the pod watch (API Concepts,
    "Efficient detection of changes", above): an expiry is one new watch from the last
    version delivered, never a list; Events that happen meanwhile still arrive."""
    cluster = make_cluster(nodes=2)
    provider = make_provider(cluster, watch_timeout_s=1)
    gates = [cluster.gates.add("watch_received", lambda ctx: ctx.kind == "events") for _ in "123"]
    created = asyncio.ensure_future(provider.create(spec("a")))
    for n, gate in enumerate(gates, start=1):
        await gate.reached(timeout=30)  # Events watch n (n - 1 expiries so far)
        events = provider.event_informer
        assert events is not None and (events.watches, events.lists) == (n, 1)
        assert cluster.request_counts()[("watch", "events")] == n
        assert cluster.request_counts()[("list", "events")] == 1
        gate.release()
        if n == 1:
            await provider.wait_ready(await created, 30)
    info = await provider.wait_ready(await provider.create(spec("b")), 30)
    assert info.image_present is not None  # told only by b's Events: the third watch
    events = provider.event_informer
    assert events is not None and events.relists_after_gone == 0
    assert cluster.request_counts()[("list", "events")] == 1


# --- create failure plans -----------------------------------------------------------------
@pytest.mark.asyncio
@pytest.mark.parametrize("plan", ["504_after_store", "reset_after_store"])
async def test_an_ambiguous_create_is_read_back_and_deleted(
    make_cluster: MakeCluster, make_provider: MakeProvider, plan: str
) -> None:
    """Table A21, windows 16 and 17: a 504 or a reset after the pod was stored."""
    cluster = make_cluster(nodes=1)
    provider = make_provider(cluster)
    cluster.plans.add("create", plan, name_prefix="sb-")
    with pytest.raises(ProviderAmbiguous) as caught:
        await provider.create(spec("sb-1"))
    extra = caught.value.extra
    assert (extra["name"], extra["stored"], extra["reclaimed"]) == ("sb-1", True, True)
    assert extra["uid"] and extra["nonce"] == "nonce-sb-1"
    assert cluster.pods(NS) == [] and provider.pending_deletes() == []
    assert counts(cluster, "get") == 1 and counts(cluster, "delete") == 1
    deletes = [r for r in cluster.requests_log() if r["verb"] == "delete"]
    assert deletes == [{"verb": "delete", "resource": "pods", "namespace": NS, "name": "sb-1"}]


@pytest.mark.asyncio
async def test_a_500_before_store_reads_back_and_deletes_nothing(
    make_cluster: MakeCluster, make_provider: MakeProvider
) -> None:
    cluster = make_cluster(nodes=1)
    provider = make_provider(cluster)
    cluster.plans.add("create", "500_before_store")
    with pytest.raises(ProviderAmbiguous) as caught:
        await provider.create(spec("sb-1"))
    assert caught.value.extra["stored"] is False
    assert counts(cluster, "get") == 1 and counts(cluster, "delete") == 0


@pytest.mark.asyncio
async def test_a_409_for_another_tenants_pod_leaves_it_alone(
    make_cluster: MakeCluster, make_provider: MakeProvider
) -> None:
    """Table A21, window 25: the sentinel holding the name survives."""
    cluster = make_cluster(nodes=1)
    provider = make_provider(cluster)
    sentinel = cluster.put_pod(
        NS,
        {
            "metadata": {
                "name": "sb-1",
                "labels": {"app": "other-tenant"},
                "annotations": {L.NONCE_ANNOTATION: "someone-else"},
            },
            "spec": {"containers": [{"name": "c", "image": "other"}]},
        },
    )
    with pytest.raises(ProviderConflict) as caught:
        await provider.create(spec("sb-1"))
    assert caught.value.extra["holder_uid"] == sentinel["metadata"]["uid"]
    assert (
        isinstance(caught.value.__cause__, Exception)
        and getattr(caught.value.__cause__, "status", None) == 409
    )
    assert [p["metadata"]["uid"] for p in cluster.pods(NS)] == [sentinel["metadata"]["uid"]]
    assert counts(cluster, "delete") == 0
    assert unowned(cluster, provider, sentinel="sb-1") == []


@pytest.mark.asyncio
async def test_a_409_for_our_own_earlier_create_is_adopted(
    make_cluster: MakeCluster, make_provider: MakeProvider
) -> None:
    cluster = make_cluster(nodes=1)
    provider = make_provider(cluster)
    earlier = await provider.create(spec("sb-1"))
    again = await provider.create(spec("sb-1"))
    assert again.uid == earlier.uid


@pytest.mark.asyncio
async def test_a_403_sends_no_read_and_no_delete(
    make_cluster: MakeCluster, make_provider: MakeProvider
) -> None:
    cluster = make_cluster(nodes=1)
    provider = make_provider(cluster)
    cluster.plans.add("create", "403")
    with pytest.raises(ProviderForbidden) as caught:
        await provider.create(spec("sb-1"))
    assert caught.value.extra["status"] == 403
    assert counts(cluster, "get") == 0 and counts(cluster, "delete") == 0
    assert cluster.pods(NS) == []


# --- delete failure plans -----------------------------------------------------------------
@pytest.mark.asyncio
async def test_a_delete_answered_500_stays_pending_until_flushed(
    make_cluster: MakeCluster, make_provider: MakeProvider
) -> None:
    """Table A21, window 19: a failed delete is owned (pending) and flushed later."""
    cluster = make_cluster(nodes=1)
    pending: list[PendingDelete] = []
    deleted: list[tuple[str, str]] = []
    provider = make_provider(
        cluster, on_pending=pending.append, on_deleted=lambda n, u: deleted.append((n, u))
    )
    handle = await provider.create(spec("sb-1"))
    cluster.plans.add("delete", "500_not_applied", times=3)
    with pytest.raises(ProviderError) as caught:
        await provider.destroy(handle)
    assert caught.value.extra["pending"] is True
    assert [(p.name, p.uid) for p in provider.pending_deletes()] == [("sb-1", handle.uid)]
    assert [(p.name, p.uid) for p in pending] == [("sb-1", handle.uid)]
    assert cluster.pod(NS, "sb-1") is not None and unowned(cluster, provider) == []
    assert await provider.flush_pending() == 1
    assert cluster.pods(NS) == [] and provider.pending_deletes() == []
    assert deleted == [("sb-1", handle.uid)]


@pytest.mark.asyncio
async def test_a_delete_whose_reply_is_lost_is_confirmed_by_the_retry(
    make_cluster: MakeCluster, make_provider: MakeProvider
) -> None:
    """Table A21, window 20: the delete was applied, the answer reset. The retry reads the
    pod first (the lost DELETE may have been applied) and gets 404: no second DELETE. The
    pod is owned as a pending delete until then, unless its DELETED watch event came first
    and confirmed it (both orders happen)."""
    cluster = make_cluster(nodes=1)
    pending: list[PendingDelete] = []
    provider = make_provider(cluster, on_pending=pending.append)
    handle = await provider.create(spec("sb-1"))
    cluster.plans.add("delete", "reset_after_apply")
    await provider.destroy(handle)
    assert cluster.pods(NS) == [] and provider.pending_deletes() == []
    assert [p.name for p in pending] in (["sb-1"], [])
    assert counts(cluster, "delete") == 1


@pytest.mark.asyncio
@pytest.mark.parametrize("plan", ["hang_not_applied", "hang_after_apply"])
async def test_a_delete_that_times_out_is_retried_until_confirmed(
    make_cluster: MakeCluster, make_provider: MakeProvider, plan: str
) -> None:
    """Table A21, window 21: the delete times out (applied or not); the retry confirms it.
    A DELETE that was not applied is sent again after a read finds the pod; one that was
    applied is not sent again (the read, or the pod's DELETED watch event, shows it gone)."""
    cluster = make_cluster(nodes=1)
    provider = make_provider(cluster, request_timeout_s=0.5)
    handle = await provider.create(spec("sb-1"))
    cluster.plans.add("delete", plan)
    await provider.destroy(handle)
    assert cluster.pods(NS) == [] and provider.pending_deletes() == []
    assert counts(cluster, "delete") == (2 if plan == "hang_not_applied" else 1)


@pytest.mark.asyncio
async def test_pending_deletes_are_retried_in_the_background(
    make_cluster: MakeCluster, make_provider: MakeProvider
) -> None:
    cluster = make_cluster(nodes=1)
    confirmed = asyncio.Event()
    provider = make_provider(
        cluster,
        retry_pending_in_background=True,
        destroy_attempts=1,
        on_deleted=lambda name, uid: confirmed.set(),
    )
    handle = await provider.create(spec("sb-1"))
    cluster.plans.add("delete", "500_not_applied", times=3)
    with pytest.raises(ProviderError):
        await provider.destroy(handle)
    await asyncio.wait_for(confirmed.wait(), 30)
    assert cluster.pods(NS) == [] and provider.pending_deletes() == []
    assert counts(cluster, "delete") == 4


@pytest.mark.asyncio
async def test_destroy_by_name_alone_deletes_only_sandmans_pod(
    make_cluster: MakeCluster, make_provider: MakeProvider
) -> None:
    """A handle rebuilt without uid or nonce reads the pod back and checks our label."""
    cluster = make_cluster(nodes=1)
    provider = make_provider(cluster)
    await provider.create(spec("sb-1"))
    cluster.put_pod(
        NS, {"metadata": {"name": "theirs"}, "spec": {"containers": [{"name": "c", "image": "x"}]}}
    )
    await provider.destroy(Handle("sb-1", "", "kubernetes"))
    await provider.destroy(Handle("theirs", "", "kubernetes"))
    assert [p["metadata"]["name"] for p in cluster.pods(NS)] == ["theirs"]


# --- pods that never become Ready -----------------------------------------------------------
@pytest.mark.asyncio
async def test_a_pod_failing_while_starting_is_not_ready_and_destroy_removes_it(
    make_cluster: MakeCluster, make_provider: MakeProvider
) -> None:
    cluster = make_cluster(nodes=1)
    provider = make_provider(cluster)
    cluster.plans.add("pod", "fail_start")
    handle = await provider.create(spec("sb-1"))
    with pytest.raises(SandboxNotReady) as caught:
        await provider.wait_ready(handle, 30)
    assert caught.value.extra["phase"] == "Failed"
    await provider.destroy(handle)
    assert cluster.pods(NS) == []


@pytest.mark.asyncio
async def test_a_pod_that_never_becomes_ready_runs_out_its_budget(
    make_cluster: MakeCluster, make_provider: MakeProvider
) -> None:
    cluster = make_cluster(nodes=1)
    provider = make_provider(cluster)
    cluster.plans.add("pod", "never_ready")
    handle = await provider.create(spec("sb-1"))
    with pytest.raises(SandboxNotReady) as caught:
        await provider.wait_ready(handle, 0.3)
    assert caught.value.extra["reason"] == "budget"
    await provider.destroy(handle)
    assert cluster.pods(NS) == []


@pytest.mark.asyncio
async def test_wait_ready_fails_at_once_when_the_pod_is_deleted(
    make_cluster: MakeCluster, make_provider: MakeProvider
) -> None:
    cluster = make_cluster(nodes=1)
    provider = make_provider(cluster)
    cluster.plans.add("pod", "never_ready")
    handle = await provider.create(spec("sb-1"))
    cluster.delete_pod(NS, "sb-1")
    with pytest.raises(SandboxNotReady) as caught:
        await provider.wait_ready(handle, 20)
    assert caught.value.extra["reason"] == "deleted"


@pytest.mark.asyncio
async def test_a_pod_deleted_before_the_informer_ever_listed_it_fails_at_once(
    make_cluster: MakeCluster, make_provider: MakeProvider
) -> None:
    """No watch event will ever name it: the first list (newer than the create) decides."""
    cluster = make_cluster(nodes=1)
    provider = make_provider(cluster)
    listing = cluster.gates.add("list_received")
    cluster.plans.add("pod", "never_ready")
    handle = await provider.create(spec("sb-1"))
    await listing.reached(timeout=10)
    cluster.delete_pod(NS, "sb-1")
    listing.release()
    with pytest.raises(SandboxNotReady) as caught:
        await provider.wait_ready(handle, 20)
    assert caught.value.extra["reason"] == "deleted"


# --- cancellation windows -------------------------------------------------------------------
@pytest.mark.asyncio
@pytest.mark.parametrize("point", ["create_received", "create_stored"])
async def test_cancelling_a_held_create_leaves_no_pod_without_an_owner(
    make_cluster: MakeCluster, make_provider: MakeProvider, point: str
) -> None:
    """Table A21: the caller is cancelled while its create is held at the API."""
    cluster = make_cluster(nodes=1)
    provider = make_provider(cluster)
    gate = cluster.gates.add(point, name="sb-1")
    task = asyncio.create_task(provider.create(spec("sb-1")))
    await gate.reached(timeout=10)
    task.cancel()
    gate.release()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cluster.pods(NS) == [] and provider.pending_deletes() == []
    assert counts(cluster, "create") == 1 and counts(cluster, "delete") == 1


@pytest.mark.asyncio
async def test_cancelling_while_the_work_item_is_held_sends_nothing(
    make_cluster: MakeCluster, make_provider: MakeProvider
) -> None:
    cluster = make_cluster(nodes=1)
    provider = make_provider(cluster, work_item_hook=cluster.gates.work_item_hook)
    gate = cluster.gates.add("work_item", lambda ctx: ctx.verb == "create", name="sb-1")
    task = asyncio.create_task(provider.create(spec("sb-1")))
    await gate.reached(timeout=10)
    task.cancel()
    # Release only after create() has handled its cancellation: cancel() queued the task's
    # wake-up first, so a callback queued now runs after it (no timer involved).
    asyncio.get_running_loop().call_soon(gate.release)
    with pytest.raises(asyncio.CancelledError):
        await task
    assert counts(cluster, "create") == 0 and cluster.pods(NS) == []


@pytest.mark.asyncio
async def test_a_second_cancel_during_cleanup_keeps_the_pod_owned(
    make_cluster: MakeCluster, make_provider: MakeProvider
) -> None:
    """Cleanup runs on any exit, even a second cancel: the pod stays in the pending set."""
    cluster = make_cluster(nodes=1)
    confirmed = asyncio.Event()
    provider = make_provider(cluster, on_deleted=lambda name, uid: confirmed.set())
    stored = cluster.gates.add("create_stored", name="sb-1")
    deleting = cluster.gates.add("delete_received", name="sb-1")
    task = asyncio.create_task(provider.create(spec("sb-1")))
    await stored.reached(timeout=10)
    task.cancel()
    stored.release()
    await deleting.reached(timeout=10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert [p.name for p in provider.pending_deletes()] == ["sb-1"]
    assert unowned(cluster, provider) == []
    deleting.release()
    await asyncio.wait_for(confirmed.wait(), 30)
    assert cluster.pods(NS) == [] and provider.pending_deletes() == []


# --- anchors, listing, settings, shutdown ---------------------------------------------------
@pytest.mark.asyncio
async def test_deleting_the_job_anchor_garbage_collects_its_pods(
    make_cluster: MakeCluster, make_provider: MakeProvider
) -> None:
    cluster = make_cluster(nodes=1, mode="manual")
    provider = make_provider(cluster)
    anchor = await provider.ensure_anchor(7)
    assert await provider.ensure_anchor(7) == anchor and anchor.kind == "ConfigMap"
    await provider.create(spec("sb-1", owner=anchor))
    await provider.create(spec("sb-2", owner=anchor))
    cluster.run_until_idle()
    assert len(cluster.pods(NS)) == 2
    await provider.delete_anchor(7)
    await provider.delete_anchor(7)  # idempotent
    cluster.run_until_idle()
    assert cluster.pods(NS) == [] and cluster.configmaps(NS) == []


@pytest.mark.asyncio
async def test_list_owned_reports_only_pods_with_the_managed_by_label(
    make_cluster: MakeCluster, make_provider: MakeProvider
) -> None:
    cluster = make_cluster(nodes=1)
    provider = make_provider(cluster)
    cluster.put_pod(
        NS, {"metadata": {"name": "foreign"}, "spec": {"containers": [{"name": "c", "image": "x"}]}}
    )
    await provider.create(spec("sb-1"))
    await provider.create(spec("sb-2", role="grading", job_id=9))
    owned = sorted(await provider.list_owned(), key=lambda o: o.name)
    assert [(o.name, o.job_id, o.role, o.nonce) for o in owned] == [
        ("sb-1", 7, "rollout", "nonce-sb-1"),
        ("sb-2", 9, "grading", "nonce-sb-2"),
    ]
    assert all(o.uid and o.created is not None for o in owned)


@pytest.mark.asyncio
async def test_check_image_has_no_answer_before_a_create_and_sends_no_request(
    make_cluster: MakeCluster, make_provider: MakeProvider
) -> None:
    """A cluster learns of a bad image at pull time: the API layer must not refuse it."""
    cluster = make_cluster(nodes=1)
    provider = make_provider(cluster)
    assert provider.check_image("registry.invalid/no-such-image:1", None) is None
    assert provider.check_image("python:3.11", "abc123") is None
    assert provider.informer is None  # nothing was started, nothing was asked
    assert counts(cluster, "list") == counts(cluster, "get") == 0


@pytest.mark.asyncio
async def test_from_settings_loads_the_kubeconfig_into_its_own_configuration(
    make_cluster: MakeCluster, tmp_path: Path
) -> None:
    cluster = make_cluster(nodes=1)
    path = cluster.write_kubeconfig(tmp_path / "kubeconfig")
    settings = types.SimpleNamespace(
        SANDMAN_NAMESPACE=NS, SANDMAN_KUBECONFIG=str(path), SANDMAN_K8S_WORKERS=4
    )
    provider = KubernetesProvider.from_settings(settings)
    try:
        assert provider.config.namespace == NS and provider.config.max_workers == 4
        assert provider.api_client.configuration.host == cluster.url
        assert provider.api_client.configuration.connection_pool_maxsize == 8
        await provider.create(spec("sb-1"))
        assert [o.name for o in await provider.list_owned()] == ["sb-1"]
    finally:
        await provider.close()


@pytest.mark.asyncio
async def test_close_stops_the_watch_and_the_threads(
    make_cluster: MakeCluster, make_provider: MakeProvider
) -> None:
    cluster = make_cluster(nodes=1)
    provider = make_provider(cluster)
    await provider.wait_ready(await provider.create(spec("sb-1")), 30)
    assert cluster.wait_for_watchers(1, timeout=10)
    await provider.close()
    assert provider.informer is not None and not provider.informer.alive()
    assert cluster.wait_for_watchers(0, timeout=10, exact=True)
    with pytest.raises(ProviderError):
        await provider.create(spec("sb-2"))


# --- a real execd per pod ---------------------------------------------------------------------
@pytest.mark.asyncio
async def test_each_pod_becomes_ready_and_answers_at_its_own_pod_ip(
    make_cluster: MakeCluster, make_provider: MakeProvider
) -> None:
    """Issue 9 item 1: the kubelet probes podIP:port and trainers connect there, so execd
    must listen on the pod's address. The stand-in runs each pod's boot command as its spec
    says, at the pod's own loopback address (never 127.0.0.1)."""
    cluster = make_cluster(nodes=1, run_execd=True)
    provider = make_provider(cluster, verify_health=True)
    handles = [await provider.create(spec(name)) for name in ("sb-1", "sb-2")]
    infos = [await provider.wait_ready(handle, 30) for handle in handles]
    ips = [cluster.pod(NS, h.name)["status"]["podIP"] for h in handles]  # type: ignore[index]
    assert len(set(ips)) == 2 and "127.0.0.1" not in ips
    assert [info.address for info in infos] == [f"{ip}:8700" for ip in ips]
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
        for handle, info in zip(handles, infos, strict=True):
            assert await provider.health(handle, info.address, spec(handle.name).token)
            async with http.get(f"http://{info.address}/health") as resp:
                assert resp.status == 200 and (await resp.json())["ok"] is True
    for handle in handles:
        await provider.destroy(handle)


@pytest.mark.asyncio
async def test_no_token_or_key_is_in_the_pod_and_its_execd_derives_the_token(
    make_cluster: MakeCluster, make_provider: MakeProvider
) -> None:
    """Issue 9 item 2: anyone who can read pods must not read a credential. The token is
    HMAC-SHA256(job key, pod name): execd derives it from the job's Secret, which only the
    init container mounts; a token for another sandbox of the same job is refused."""
    cluster = make_cluster(nodes=1, run_execd=True)
    provider = make_provider(cluster, verify_health=True)
    one = spec("sb-1")
    handle = await provider.create(one)
    info = await provider.wait_ready(handle, 30)
    stored = json.dumps(cluster.pod(NS, "sb-1"))
    raw = provider.core.read_namespaced_pod("sb-1", NS, _preload_content=False).data.decode()
    for text in (stored, raw):
        assert one.token not in text and JOB_KEY not in text
    (secret,) = cluster.secrets(NS)
    assert secret["metadata"]["name"] == "sandman-job-7-execd"
    assert secret["metadata"]["labels"][L.JOB] == "7"
    assert base64.b64decode(secret["data"]["key"]).decode() == JOB_KEY
    assert await provider.health(handle, info.address, one.token)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
        for token, status in ((one.token, 200), (spec("sb-2").token, 401), (JOB_KEY, 401)):
            auth = {"Authorization": f"Bearer {token}"}
            async with http.post(
                f"http://{info.address}/exec", json={"command": "true"}, headers=auth
            ) as resp:
                assert resp.status == status
    await provider.destroy(handle)


@pytest.mark.asyncio
async def test_run_execd_end_to_end(make_cluster: MakeCluster, make_provider: MakeProvider) -> None:
    if not (REPO / "execd" / "__main__.py").exists():
        pytest.skip("execd/__main__.py does not exist yet (python3 -m execd is being built)")
    cluster = make_cluster(nodes=1, run_execd=True)
    provider = make_provider(cluster, verify_health=True)
    one = spec("sb-1")
    handle = await provider.create(one)
    info = await provider.wait_ready(handle, 60)
    host, port = info.address.rsplit(":", 1)
    pod_ip = cluster.pod(NS, "sb-1")["status"]["podIP"]  # type: ignore[index]
    assert host == pod_ip != "127.0.0.1" and int(port) == 8700
    assert await provider.health(handle, info.address, one.token)
    auth = {"Authorization": f"Bearer {one.token}"}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
        async with http.get(f"http://{info.address}/health") as resp:
            assert resp.status == 200 and (await resp.json())["ok"] is True
        async with http.post(
            f"http://{info.address}/exec", json={"command": "echo hi; env"}, headers=auth
        ) as resp:
            assert resp.status == 200
            result = await resp.json()
        assert result["exit_code"] == 0 and result["output"].startswith("hi")
        assert one.token not in result["output"] and JOB_KEY not in result["output"]
        if "PYTHONPATH" not in os.environ:  # the carrier's path does not leak into commands
            assert "PYTHONPATH=" not in result["output"]
        async with http.post(f"http://{info.address}/exec", json={"command": "true"}) as resp:
            assert resp.status == 401
    await provider.destroy(handle)
    cluster.run_until_idle()  # the stand-in stops (and reaps) execd when the pod goes
    assert cluster._call(lambda: cluster.execd.running()) == {}
