"""Stuck pods against the stand-in over real HTTP: fail fast with the cluster's reason.

Final (fail at once): ImagePullBackOff of the task image or of an init container (the
kubelet's back-off says the pull failed). Wait-and-see (may clear; the budget decides, and
its error names the reason): Unschedulable and SchedulingGated.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from sandboxes.providers.kubernetes import KubernetesProvider
from sandboxes.tests.providers.conftest import NS, spec
from sandman_site.errors import SandboxNotReady
from standin import StandinCluster

MakeCluster = Callable[..., StandinCluster]
MakeProvider = Callable[..., KubernetesProvider]
# Bounds only the old provider's failure mode (waiting out the budget); never a sync.
BUDGET_S = 20


@pytest.mark.asyncio
async def test_a_bad_task_image_fails_fast_with_image_pull_back_off(
    make_cluster: MakeCluster, make_provider: MakeProvider
) -> None:
    """Kubernetes -- Images, "ImagePullBackOff"
    (https://kubernetes.io/docs/concepts/containers/images/#imagepullbackoff)."""
    cluster = make_cluster(nodes=1)
    cluster.plans.add("pod", "bad_image", name_prefix="bad")
    provider = make_provider(cluster)
    handle = await provider.create(spec("bad", image="task/missing:1"))
    with pytest.raises(SandboxNotReady) as caught:
        await provider.wait_ready(handle, BUDGET_S)
    extra = caught.value.extra
    assert extra["reason"] == "ImagePullBackOff" and extra["container"] == "sandbox"
    assert 'Back-off pulling image "task/missing:1"' in str(caught.value)
    assert cluster.pod(NS, "bad") is not None  # the caller (the pool) deletes it


@pytest.mark.asyncio
async def test_a_carrier_image_outage_fails_fast_naming_the_init_container(
    make_cluster: MakeCluster, make_provider: MakeProvider
) -> None:
    """Kubernetes -- Init Containers
    (https://kubernetes.io/docs/concepts/workloads/pods/init-containers/)."""
    cluster = make_cluster(nodes=1)
    cluster.plans.add("pod", "carrier_outage", name_prefix="co")
    provider = make_provider(cluster)
    handle = await provider.create(spec("co"))
    with pytest.raises(SandboxNotReady) as caught:
        await provider.wait_ready(handle, BUDGET_S)
    extra = caught.value.extra
    assert extra["reason"] == "ImagePullBackOff" and extra["container"] == "execd-carrier"
    assert extra["init"] is True


@pytest.mark.asyncio
async def test_a_gated_or_unschedulable_pod_out_of_budget_names_the_scheduling_reason(
    make_cluster: MakeCluster, make_provider: MakeProvider
) -> None:
    """Kubernetes -- Pod Scheduling Readiness
    (https://kubernetes.io/docs/concepts/scheduling-eviction/pod-scheduling-readiness/) and
    Pod Lifecycle -- Pod conditions (PodScheduled False, reason Unschedulable),
    https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/#pod-conditions .
    Both may clear, so they are not final: the budget runs, and its error says why."""
    cluster = make_cluster(nodes=1)
    cluster.plans.add("create", "scheduling_gate", name_prefix="gated")
    provider = make_provider(cluster)
    gated = await provider.create(spec("gated"))
    big = await provider.create(spec("big", cpu_millis=64_000))
    # One pod stream, in order: once this later pod is Ready the provider has seen both
    # pods' PodScheduled=False updates.
    marker = await provider.create(spec("marker"))
    await provider.wait_ready(marker, BUDGET_S)
    for handle, reason in ((gated, "SchedulingGated"), (big, "Unschedulable")):
        with pytest.raises(SandboxNotReady) as caught:
            await provider.wait_ready(handle, 0.2)
        assert caught.value.extra["reason"] == "budget"
        assert caught.value.extra["waiting_on"] == reason
        assert reason in str(caught.value)
    assert "Insufficient cpu" in str(caught.value)


@pytest.mark.asyncio
async def test_a_gated_pod_becomes_ready_once_the_gate_is_removed(
    make_cluster: MakeCluster, make_provider: MakeProvider
) -> None:
    """Pod Scheduling Readiness: removing the gates lets the scheduler take the pod."""
    cluster = make_cluster(nodes=1)
    cluster.plans.add("create", "scheduling_gate", name_prefix="held")
    provider = make_provider(cluster)
    handle = await provider.create(spec("held"))
    provider.core.patch_namespaced_pod("held", NS, {"spec": {"schedulingGates": None}})
    info = await provider.wait_ready(handle, BUDGET_S)
    assert info.node == "node-0"
