"""The NetworkPolicy of egress-allowed sandboxes (issue 12, item 4): the outside world,
but never the node metadata address nor the cluster's pod and service ranges.

The manifests are rendered (``k8s/networkpolicies.yaml`` as kustomize lists it, and
``manage.py render_networkpolicy`` for other ranges) and the policy is checked as data;
no test here connects to 169.254.169.254. Semantics from the Kubernetes docs:
https://kubernetes.io/docs/concepts/services-networking/network-policies/ (an ``ipBlock``
``except`` must lie inside its ``cidr``; policies are additive allow-lists, so the
egress of a selected pod is exactly the union of its rules).
"""

from __future__ import annotations

import ipaddress
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.core.management import call_command
from django.core.management.base import CommandError
from kubernetes import client

from sandboxes import labels as L
from sandboxes.providers.kubernetes.netpolicy import egress_allow_policy

K8S = Path(__file__).resolve().parents[3] / "k8s"
METADATA = ipaddress.ip_address("169.254.169.254")


def _policies() -> dict[str, dict[str, Any]]:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    docs = [
        d
        for name in kustomization["resources"]
        for d in yaml.safe_load_all((K8S / name).read_text())
        if d
    ]
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == "NetworkPolicy"}


def _admitted(policy: dict[str, Any], address: str, port: int = 443) -> bool:
    """Whether the policy's ipBlock rules admit TCP to ``address`` (any port rule)."""
    ip = ipaddress.ip_address(address)
    for rule in policy["spec"]["egress"]:
        for peer in rule.get("to", []):
            block = peer.get("ipBlock")
            if block is None:
                continue
            if ip in ipaddress.ip_network(block["cidr"]) and not any(
                ip in ipaddress.ip_network(c) for c in block.get("except", [])
            ):
                ports = rule.get("ports")
                if not ports or any(p.get("port") == port for p in ports):
                    return True
    return False


def test_the_shipped_policy_is_the_default_render_and_selects_allow_sandboxes() -> None:
    policy = _policies()["sandbox-allow-egress-outside"]
    assert policy == egress_allow_policy("sandman-sandboxes")
    assert policy["spec"]["podSelector"]["matchLabels"][L.EGRESS] == "allow"
    assert policy["spec"]["policyTypes"] == ["Egress"]
    model = client.ApiClient()._ApiClient__deserialize(policy, "V1NetworkPolicy")  # noqa: SLF001
    assert model.spec.egress[0].to[0].ip_block._except  # noqa: SLF001 - the model's name


def test_allow_admits_the_outside_world_but_not_metadata_pods_or_services() -> None:
    policy = _policies()["sandbox-allow-egress-outside"]
    for outside in ("1.1.1.1", "8.8.8.8", "93.184.216.34", "169.254.169.253"):
        assert _admitted(policy, outside), outside
    for inside in (str(METADATA), "10.244.3.7", "10.96.0.1", "10.111.22.33"):
        assert not _admitted(policy, inside), inside
    for rule in policy["spec"]["egress"]:
        for peer in rule["to"]:
            block = peer.get("ipBlock")
            if block:  # every except lies inside its cidr (the API server checks it)
                network = ipaddress.ip_network(block["cidr"])
                assert all(ipaddress.ip_network(c).subnet_of(network) for c in block["except"])
    (dns,) = [r for r in policy["spec"]["egress"] if "ports" in r]
    assert {p["port"] for p in dns["ports"]} == {53}
    assert dns["to"][0]["podSelector"]["matchLabels"] == {"k8s-app": "kube-dns"}


def test_the_deny_policy_still_admits_nothing() -> None:
    deny = _policies()["sandbox-deny-egress"]
    assert deny["spec"]["egress"] == [] and not _admitted(deny, "1.1.1.1")


def test_other_cluster_ranges_are_rendered_by_the_command() -> None:
    out = StringIO()
    call_command(
        "render_networkpolicy",
        "--namespace",
        "sb",
        "--pod-cidr",
        "100.64.0.0/14",
        "--service-cidr",
        "172.20.0.0/16",
        "--service-cidr",
        "fd00:10:96::/112",
        stdout=out,
    )
    policy = yaml.safe_load(out.getvalue())
    assert policy["metadata"]["namespace"] == "sb"
    assert not _admitted(policy, "100.65.1.1") and not _admitted(policy, "172.20.0.10")
    assert not _admitted(policy, str(METADATA)) and _admitted(policy, "10.244.0.5")
    assert not _admitted(policy, "fd00:10:96::1") and _admitted(policy, "2606:4700::1111")
    with pytest.raises(CommandError, match="not a CIDR"):
        call_command("render_networkpolicy", "--pod-cidr", "10.0.0.0/33", stdout=StringIO())
