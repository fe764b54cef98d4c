"""Subnets of the stand-in's VPC and the addresses each node's CNI holds from them.

The model follows the Amazon VPC CNI (``aws-node``/ipamd): pods get VPC addresses from the
subnet of their node's ENIs, so a subnet's free addresses bound how many pods its nodes can
start, whatever their CPU and memory. Per node, ipamd holds

* one address for the node itself (the primary ENI's primary address),
* one for every pod it assigned an address to, and
* up to ``WARM_IP_TARGET`` spare ("warm") addresses, topped up from the subnet after every
  assignment and returned to it when more than that are spare.

A subnet's usable size is its CIDR size minus the 5 addresses AWS reserves in every subnet
(network, VPC router, DNS, future use, broadcast). ``AvailableIpAddressCount`` -- what EC2's
``DescribeSubnets`` reports and the control route ``/_standin/subnets`` serves in the same
document shape -- is usable minus held minus what other workloads took
(:meth:`Subnet.consume`). When a node has no warm address and its subnet none free, the
assignment fails with the CNI's message and the kubelet retries (``kubelet.py``).

Invariant: ``held`` of a subnet is the sum over its nodes of (1 + assigned + warm); an
address is never held twice (assign and release are idempotent per pod uid).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Any

AWS_RESERVED_PER_SUBNET = 5
ZONE_LABEL = "topology.kubernetes.io/zone"


@dataclass(frozen=True)
class SubnetSpec:
    id: str
    cidr: str
    zone: str = "standin-1a"
    vpc: str = "vpc-standin"


@dataclass
class Subnet:
    spec: SubnetSpec
    held: int = 0  # held by the nodes' ipamd (node, pods, warm)
    taken: int = 0  # taken by other workloads (consume)

    @property
    def usable(self) -> int:
        size = ipaddress.ip_network(self.spec.cidr).num_addresses
        return max(0, size - AWS_RESERVED_PER_SUBNET)

    @property
    def available(self) -> int:
        return max(0, self.usable - self.held - self.taken)

    def consume(self, count: int) -> int:
        """Another workload takes (``count`` > 0) or gives back (< 0) addresses; returns
        the new available count."""
        self.taken = max(0, min(self.usable - self.held, self.taken + count))
        return self.available

    def describe(self) -> dict[str, Any]:
        """One ``Subnet`` as EC2 ``DescribeSubnets`` reports it (the fields we model)."""
        return {
            "SubnetId": self.spec.id,
            "VpcId": self.spec.vpc,
            "CidrBlock": self.spec.cidr,
            "AvailabilityZone": self.spec.zone,
            "AvailableIpAddressCount": self.available,
            "State": "available",
        }


@dataclass
class NodeAddresses:
    """ipamd on one node: the addresses it holds from its subnet."""

    subnet: Subnet
    warm_ip_target: int
    assigned: set[str] = field(default_factory=set)
    warm: int = 0
    attached: bool = False

    def attach(self) -> None:
        """The node joins: its own address, then the warm pool (as far as the subnet has)."""
        if not self.attached and self.subnet.available > 0:
            self.subnet.held += 1
            self.attached = True
        self.top_up()

    def top_up(self) -> None:
        take = min(max(0, self.warm_ip_target - self.warm), self.subnet.available)
        self.warm += take
        self.subnet.held += take

    def assign(self, uid: str) -> bool:
        """An address for the pod (a warm one, else straight from the subnet); False when
        neither has one (the CNI's "failed to assign an IP address to container")."""
        if uid in self.assigned:
            return True
        if self.warm == 0 and self.subnet.available > 0:
            self.warm += 1
            self.subnet.held += 1
        if self.warm == 0:
            return False
        self.warm -= 1
        self.assigned.add(uid)
        self.top_up()
        return True

    def release(self, uid: str) -> None:
        if uid not in self.assigned:
            return
        self.assigned.discard(uid)
        self.warm += 1
        surplus = self.warm - self.warm_ip_target
        if surplus > 0:
            self.warm -= surplus
            self.subnet.held -= surplus

    def summary(self) -> dict[str, Any]:
        return {
            "subnet": self.subnet.spec.id,
            "assigned_addresses": len(self.assigned),
            "warm_addresses": self.warm,
        }


def describe_subnets(subnets: list[Subnet]) -> dict[str, Any]:
    """The ``DescribeSubnets`` answer document (``{"Subnets": [...]}``)."""
    return {"Subnets": [s.describe() for s in subnets]}
