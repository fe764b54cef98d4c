"""The stand-in's VPC subnets: pods take addresses of their node's subnet, as with the
Amazon VPC CNI, and the free count is read in EC2 ``DescribeSubnets``' document shape.

What the model follows (cited, not copied):
* Amazon VPC CNI (docs.aws.amazon.com/eks/latest/userguide/managing-vpc-cni.html and the
  plugin's docs/eni-and-ip-target.md): every pod gets a VPC address from its node's ENI
  subnet; ipamd keeps ``WARM_IP_TARGET`` spare addresses attached to the node; with none
  left the CNI answers "failed to assign an IP address to container" and the kubelet retries.
* Amazon VPC user guide, "Subnet CIDR blocks" (docs.aws.amazon.com/vpc/latest/userguide/
  subnet-sizing.html): the first four and the last address of every subnet are reserved.
* EC2 API reference, ``Subnet`` (docs.aws.amazon.com/AWSEC2/latest/APIReference/
  API_Subnet.html): ``AvailableIpAddressCount``, ``SubnetId``, ``AvailabilityZone``.
* Kubernetes well-known labels (kubernetes.io/docs/reference/labels-annotations-taints/):
  ``topology.kubernetes.io/zone`` on every node.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable

from standin import StandinCluster
from standin.subnets import SubnetSpec
from standin.tests.conftest import NS, core_for, pod

SUBNETS = [SubnetSpec("subnet-a", "10.0.0.0/28", "zone-a"), SubnetSpec("subnet-b", "10.0.1.0/24")]


def _free(cluster: StandinCluster) -> dict[str, int]:
    with urllib.request.urlopen(f"{cluster.url}/_standin/subnets", timeout=10) as answer:
        doc = json.loads(answer.read())
    return {s["SubnetId"]: s["AvailableIpAddressCount"] for s in doc["Subnets"]}


def test_a_subnet_reports_its_size_less_the_reserved_addresses_and_what_nodes_hold(
    make_cluster: Callable[..., StandinCluster],
) -> None:
    cluster = make_cluster(nodes=3, mode="manual", subnets=SUBNETS, warm_ip_target=2)
    # /28: 16 - 5 reserved = 11; node-0 and node-2 hold 1 + 2 warm each -> 5.
    # /24: 256 - 5 = 251; node-1 holds 3 -> 248.
    assert _free(cluster) == {"subnet-a": 5, "subnet-b": 248}
    zones = {n["name"]: n["labels"]["topology.kubernetes.io/zone"] for n in cluster.nodes()}
    assert zones == {"node-0": "zone-a", "node-1": "standin-1a", "node-2": "zone-a"}


def test_pods_take_addresses_of_their_subnet_until_none_is_left_then_fail_assignment(
    make_cluster: Callable[..., StandinCluster],
) -> None:
    cluster = make_cluster(
        nodes=[_node("node-0")], mode="manual", subnets=SUBNETS[:1], warm_ip_target=1
    )
    core = core_for(cluster)
    try:
        assert _free(cluster) == {"subnet-a": 9}  # 11 - node - 1 warm
        for i in range(11):
            core.create_namespaced_pod(NS, pod(f"p{i:02d}", cpu="10m", memory="16Mi"))
        # Simulated time, not run_until_idle: the pod left without an address retries
        # every address_retry_s for as long as none is free, so the queue never empties.
        cluster.advance(120)
        pods = {p["metadata"]["name"]: p for p in cluster.pods(NS)}
        addressed = sorted(n for n, p in pods.items() if p["status"].get("podIP"))
        # 10 addresses for pods (9 free + the warm one), the 11th waits with none left.
        assert len(addressed) == 10 and _free(cluster) == {"subnet-a": 0}
        (waiting,) = set(pods) - set(addressed)
        failed = [
            e
            for e in cluster.events()
            if e["involvedObject"]["name"] == waiting and e["reason"] == "FailedCreatePodSandBox"
        ]
        assert failed and "failed to assign an IP address to container" in failed[0]["message"]

        # A deleted pod gives its address back: the waiting pod gets it on its retry.
        core.delete_namespaced_pod(addressed[0], NS, grace_period_seconds=0)
        cluster.advance(120)
        again = cluster.pod(NS, waiting)
        assert again is not None and again["status"].get("podIP")
    finally:
        core.api_client.close()


def test_another_workload_taking_addresses_lowers_the_count_and_giving_back_raises_it(
    make_cluster: Callable[..., StandinCluster],
) -> None:
    cluster = make_cluster(nodes=2, subnets=SUBNETS, warm_ip_target=1)
    assert _free(cluster)["subnet-b"] == 249
    body = json.dumps({"count": 200}).encode()
    request = urllib.request.Request(
        f"{cluster.url}/_standin/subnets/subnet-b/consume", data=body, method="POST"
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert json.loads(answer.read()) == {"AvailableIpAddressCount": 49}
    assert _free(cluster)["subnet-b"] == 49
    assert cluster.consume_addresses("subnet-b", -150) == 199


def test_the_command_line_builds_subnets_and_pool_labels() -> None:
    from standin.cli import cluster_from_options

    options = {
        "nodes": 2, "node_cpu": "4", "node_memory": "8Gi", "speed": 1.0, "seed": 0,
        "warm_addresses": 2, "run_execd": False, "host": "127.0.0.1", "port": 0,
        "subnet": ["subnet-x=10.1.0.0/28@zone-x"], "warm_ip_target": 3,
        "node_label": ["sandman.dev/node-pool=sandboxes"],
    }  # fmt: skip
    cluster = cluster_from_options(options)
    cluster.start()
    try:
        assert cluster.subnets()["Subnets"][0]["AvailableIpAddressCount"] == 11 - 2 * 4
        labels = cluster.nodes()[0]["labels"]
        assert labels["sandman.dev/node-pool"] == "sandboxes"
        assert labels["topology.kubernetes.io/zone"] == "zone-x"
    finally:
        cluster.stop()


def _node(name: str):
    from standin import NodeSpec

    return NodeSpec(name)
