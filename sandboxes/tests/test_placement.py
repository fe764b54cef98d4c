"""Placement: a job's sandboxes select a node pool by its label, never an instance type.

Table A14 of the paper: nine jobs pinned to one instance type never started when that type
ran out while their pool had other nodes free. So a selector on an instance-type label is
refused (``instance_type_selector``, 400, nothing written), and a pod carries a
``nodeSelector`` on the configured pool label (Kubernetes: "Assigning Pods to Nodes",
kubernetes.io/docs/concepts/scheduling-eviction/assign-pod-node/#nodeselector; the
well-known ``node.kubernetes.io/instance-type`` label,
kubernetes.io/docs/reference/labels-annotations-taints/#nodekubernetesioinstance-type).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from sandboxes import placement
from sandboxes.models import Job, Sandbox
from sandboxes.providers.kubernetes.config import KubernetesConfig
from sandboxes.tests.api_support import api, job_payload, make_user, row_counts
from sandboxes.tests.controller_support import acquire_args, make_job
from sandman_site.errors import InvalidInput
from standin import NodeSpec, StandinCluster
from standin.harness.support import NS, k8s_provider

POOL = "sandman.dev/node-pool"


@pytest.mark.parametrize(
    "key",
    [
        "node.kubernetes.io/instance-type",
        "beta.kubernetes.io/instance-type",
        "karpenter.k8s.aws/instance-family",
        "example.com/machine-type",
    ],
)
def test_an_instance_type_label_is_refused_with_a_reason(key: str) -> None:
    with pytest.raises(placement.InstanceTypeSelector) as refused:
        placement.check_selector({key: "m5.large"}, where="placement.node_selector")
    assert refused.value.code == "instance_type_selector" and refused.value.status == 400
    assert key in refused.value.message and "Table A14" in refused.value.message


def test_a_pool_label_and_other_labels_pass_and_merge_with_the_default_pool() -> None:
    assert placement.check_selector({"karpenter.sh/nodepool": "sbx"}, where="w") == {
        "karpenter.sh/nodepool": "sbx"
    }
    with pytest.raises(InvalidInput):
        placement.check_selector({"not a key!": "x"}, where="w")
    merged = placement.node_selector(
        pool_label=POOL, default_pool="general", job_pool="", job_selector={"disk": "ssd"}
    )
    assert merged == {"disk": "ssd", POOL: "general"}
    assert placement.node_selector(
        pool_label=POOL, default_pool="general", job_pool="big", job_selector={}
    ) == {POOL: "big"}
    none = placement.node_selector(pool_label=POOL, default_pool="", job_pool="", job_selector={})
    assert none == {}  # no pool anywhere: the pod carries no nodeSelector


def test_the_provider_refuses_an_instance_type_as_its_pool_label() -> None:
    with pytest.raises(ValueError, match="instance type"):
        KubernetesConfig(node_pool_label="node.kubernetes.io/instance-type", node_pool="m5")
    assert KubernetesConfig(node_pool_label="karpenter.sh/nodepool", node_pool="sbx").node_pool


@pytest.mark.django_db
def test_a_job_pinned_to_an_instance_type_is_a_400_that_writes_nothing() -> None:
    _, token = make_user("alice")
    before = row_counts()
    body = job_payload(placement={"node_selector": {"node.kubernetes.io/instance-type": "p4d"}})
    answer = api(token).post("/api/v1/jobs/", body, format="json")
    assert answer.status_code == 400
    assert answer.json()["error"] == "instance_type_selector"
    assert "node.kubernetes.io/instance-type" in answer.json()["detail"]
    assert row_counts() == before


@pytest.mark.django_db
def test_a_job_names_its_node_pool_and_the_answer_shows_it() -> None:
    _, token = make_user("alice")
    body = job_payload(placement={"node_pool": "sbx-b", "node_selector": {"disk": "ssd"}})
    answer = api(token).post("/api/v1/jobs/", body, format="json")
    assert answer.status_code == 201, answer.json()
    assert answer.json()["placement"] == {"node_pool": "sbx-b", "node_selector": {"disk": "ssd"}}
    job = Job.objects.get(pk=answer.json()["id"])
    assert (job.node_pool, job.node_selector) == ("sbx-b", {"disk": "ssd"})


@pytest.fixture
def pooled_cluster() -> Iterator[StandinCluster]:
    nodes = [
        NodeSpec("a-0", labels={POOL: "sbx-a", "node.kubernetes.io/instance-type": "m5"}),
        NodeSpec("a-1", labels={POOL: "sbx-a", "node.kubernetes.io/instance-type": "c5"}),
        NodeSpec("b-0", labels={POOL: "sbx-b", "node.kubernetes.io/instance-type": "m5"}),
    ]
    cluster = StandinCluster(nodes=nodes, run_execd=True)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.gates.release_all()
        cluster.run_until_idle(timeout=60)
        cluster.stop()


def test_sandboxes_land_only_on_nodes_of_their_pool_or_the_default_pool(
    make_controller: Any, pooled_cluster: StandinCluster
) -> None:
    provider = k8s_provider(pooled_cluster, node_pool_label=POOL, node_pool="sbx-a")
    controller = make_controller(provider=provider)
    default_job = make_job()
    b_job = make_job(node_pool="sbx-b")
    got = [controller.acquire(**acquire_args(default_job)) for _ in range(3)]
    got_b = controller.acquire(**acquire_args(b_job))

    def node_of(name: str) -> tuple[str, dict[str, str]]:
        pod = pooled_cluster.pod(NS, name)
        assert pod is not None
        return pod["spec"]["nodeName"], pod["spec"]["nodeSelector"]

    placed = [node_of(g.name) for g in got]
    assert {node for node, _ in placed} <= {"a-0", "a-1"}  # both types of pool a serve it
    assert all(selector == {POOL: "sbx-a"} for _, selector in placed)
    assert node_of(got_b.name) == ("b-0", {POOL: "sbx-b"})
    assert Sandbox.objects.get(pk=got_b.sandbox_id).state == "in_use"
