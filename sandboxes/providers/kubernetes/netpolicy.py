"""The NetworkPolicy of egress-allowed sandbox pods: the outside world, not the cluster.

Pure (no client, no I/O): ``egress_allow_policy`` renders the policy as a plain dict, the
form ``k8s/networkpolicies.yaml`` holds (a test checks the file equals the default render)
and ``manage.py render_networkpolicy`` prints for other ranges.

What it admits, for pods labelled ``sandman.dev/egress=allow``: every IPv4 destination
except the node metadata address (169.254.169.254/32: pods without an egress guard
obtained instance-metadata tokens: the security finding of 20 Oct in Appendix M) and the cluster's
pod and service ranges, which differ per cluster and are configurable
(``SANDMAN_K8S_POD_CIDRS``, ``SANDMAN_K8S_SERVICE_CIDRS``; kubeadm's defaults here), plus
DNS to the cluster's resolver pods (kube-system, ``k8s-app=kube-dns``, port 53), which
live inside the excluded pod range. IPv6 is admitted only where IPv6 ranges to exclude
are given (a ``::/0`` peer would otherwise reach an IPv6 cluster's pods).

Invariant: every excluded range is validated and normalised with ``ipaddress`` and sits
inside the ``ipBlock.cidr`` it is excepted from (the API server refuses an ``except``
outside its ``cidr``).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from typing import Any

from sandboxes import labels as L

METADATA_CIDRS = ("169.254.169.254/32",)
DEFAULT_POD_CIDRS = ("10.244.0.0/16",)  # kubeadm + flannel's podSubnet
DEFAULT_SERVICE_CIDRS = ("10.96.0.0/12",)  # kubeadm's serviceSubnet
POLICY_NAME = "sandbox-allow-egress-outside"


def _networks(cidrs: Sequence[str]) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    networks = []
    for text in cidrs:
        try:
            networks.append(ipaddress.ip_network(text.strip(), strict=False))
        except ValueError as exc:
            raise ValueError(f"{text!r} is not a CIDR range: {exc}") from None
    return networks


def excluded_ranges(
    pod_cidrs: Sequence[str] = DEFAULT_POD_CIDRS,
    service_cidrs: Sequence[str] = DEFAULT_SERVICE_CIDRS,
) -> list[str]:
    """Metadata, pod and service ranges, normalised, de-duplicated, in that order."""
    seen: dict[str, None] = {}
    for network in _networks([*METADATA_CIDRS, *pod_cidrs, *service_cidrs]):
        seen[str(network)] = None
    return list(seen)


def egress_allow_policy(
    namespace: str,
    *,
    pod_cidrs: Sequence[str] = DEFAULT_POD_CIDRS,
    service_cidrs: Sequence[str] = DEFAULT_SERVICE_CIDRS,
) -> dict[str, Any]:
    excluded = excluded_ranges(pod_cidrs, service_cidrs)
    v4 = [c for c in excluded if ipaddress.ip_network(c).version == 4]
    v6 = [c for c in excluded if ipaddress.ip_network(c).version == 6]
    peers: list[dict[str, Any]] = [{"ipBlock": {"cidr": "0.0.0.0/0", "except": v4}}]
    if v6:
        peers.append({"ipBlock": {"cidr": "::/0", "except": v6}})
    dns = {
        "to": [
            {
                "namespaceSelector": {
                    "matchLabels": {"kubernetes.io/metadata.name": "kube-system"}
                },
                "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
            }
        ],
        "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
    }
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": POLICY_NAME, "namespace": namespace},
        "spec": {
            "podSelector": {"matchLabels": {L.MANAGED_BY: L.VALUE_MANAGED_BY, L.EGRESS: "allow"}},
            "policyTypes": ["Egress"],
            "egress": [{"to": peers}, dns],
        },
    }
