"""Nodes, placement and the address model of the stand-in cluster.

Placement (one pending pod at a time, oldest first): a node must have the pod's CPU and
memory requests free and match its ``nodeSelector``. A ``topologySpreadConstraints`` entry
over ``kubernetes.io/hostname`` keeps the pods its ``labelSelector`` selects within
``maxSkew`` of the least-loaded node (``DoNotSchedule``: only such nodes;
``ScheduleAnyway``: prefer them). Among the remaining nodes the most allocated one wins
(ties: first node), which packs a burst onto few nodes like the default scheduler's
tendency the paper observed (§5.2, Table A13).

Address model (§5.2): each node keeps ``warm_addresses`` spare addresses; an assignment
fails with probability ``slope * (recent - warm_addresses)`` (capped at ``max_p``), where
``recent`` counts pods bound to the node within the last ``window_s`` simulated seconds.
So failures grow with how many of a burst's pods land on one node, and spreading lowers
them. The RNG is the cluster's seeded one: a fixed request order gives fixed failures.

Pod addresses, as a CNI's host-local IPAM hands them out: every node owns a /24 of the
cluster's pod range and gives each pod its own address from it, never one a pod on the node
still holds. The range is in 127.0.0.0/8 (all of it is on ``lo`` on Linux), so a real process
can bind a pod's address; it is never 127.0.0.1 (the ``127.0.0.0/24`` block is never used),
and a cluster picks its own block at random so parallel clusters on one host do not share
addresses.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from standin.selectors import Requirement, labels_match
from standin.subnets import ZONE_LABEL, NodeAddresses, Subnet, SubnetSpec

HOSTNAME = "kubernetes.io/hostname"

_QTY = re.compile(r"^([0-9.]+(?:[eE][+-]?[0-9]+)?)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")
_MULT = {
    None: 1,
    "m": 1e-3,
    "k": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "P": 1e15,
    "E": 1e18,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}


def quantity(value: Any) -> float:
    """A Kubernetes quantity as a float in base units (cores or bytes)."""
    m = _QTY.match(str(value).strip())
    if not m:
        raise ValueError(f"not a quantity: {value!r}")
    return float(m.group(1)) * _MULT[m.group(2)]


def pod_requests(spec: Mapping[str, Any]) -> tuple[int, int]:
    """(cpu millis, memory bytes) the scheduler reserves: containers summed, init max."""

    def one(container: Mapping[str, Any]) -> tuple[int, int]:
        res = container.get("resources") or {}
        req = {**(res.get("limits") or {}), **(res.get("requests") or {})}
        cpu = round(quantity(req["cpu"]) * 1000) if "cpu" in req else 0
        mem = round(quantity(req["memory"])) if "memory" in req else 0
        return cpu, mem

    main = [one(c) for c in spec.get("containers") or []]
    init = [one(c) for c in spec.get("initContainers") or []]
    cpu = max([sum(c for c, _ in main)] + [c for c, _ in init])
    mem = max([sum(m for _, m in main)] + [m for _, m in init])
    return cpu, mem


def selector_requirements(selector: Mapping[str, Any] | None) -> tuple[Requirement, ...]:
    """A ``metav1.LabelSelector`` (matchLabels / matchExpressions) as requirements."""
    if not selector:
        return ()
    reqs = [
        Requirement(k, "=", frozenset([v])) for k, v in (selector.get("matchLabels") or {}).items()
    ]
    ops = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!exists"}
    for expr in selector.get("matchExpressions") or []:
        reqs.append(
            Requirement(expr["key"], ops[expr["operator"]], frozenset(expr.get("values") or []))
        )
    return tuple(reqs)


@dataclass(frozen=True)
class NodeSpec:
    name: str
    cpu: str = "16"
    memory: str = "64Gi"
    max_pods: int = 110
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class AddressModel:
    warm_addresses: int = 2
    slope: float = 0.05
    max_p: float = 0.9
    window_s: float = 30.0

    def failure_probability(self, recent: int) -> float:
        return min(self.max_p, self.slope * max(0, recent - self.warm_addresses))


@dataclass
class NodeState:
    spec: NodeSpec
    index: int
    cpu_millis: int
    memory_bytes: int
    pods: dict[str, tuple[int, int, Mapping[str, str], str]] = field(default_factory=dict)
    images: dict[str, float] = field(default_factory=dict)  # image -> sim time it is present
    binds: deque[float] = field(default_factory=deque)
    address_failures: int = 0
    unreachable: bool = False  # lost: Ready Unknown, takes no new pods
    used_cpu: int = 0
    used_mem: int = 0
    pod_block: int = 0  # this node's /24 of 127.0.0.0/8 is 127.<pod_block // 256>.<% 256>.0
    _next_host: int = 2
    # The VPC CNI's addresses from this node's subnet (``subnets.py``); None: not modelled.
    addresses: NodeAddresses | None = None
    _ips: dict[str, str] = field(default_factory=dict)  # pod uid -> the address it holds
    # Spread counts per (namespace, selector), kept current on add/remove: O(1) per pick.
    _counts: dict[tuple[str, tuple[Requirement, ...]], int] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def labels(self) -> dict[str, str]:
        zone = {} if self.addresses is None else {ZONE_LABEL: self.addresses.subnet.spec.zone}
        return {HOSTNAME: self.spec.name, **zone, **self.spec.labels}

    @property
    def ip(self) -> str:
        return f"192.168.{self.index // 250}.{self.index % 250 + 2}"

    def allocated(self) -> tuple[int, int]:
        return self.used_cpu, self.used_mem

    def add_pod(self, uid: str, cpu: int, mem: int, labels: Mapping[str, str], ns: str) -> None:
        self.pods[uid] = (cpu, mem, labels, ns)
        self.used_cpu += cpu
        self.used_mem += mem
        for cns, reqs in self._counts:
            if cns == ns and labels_match(reqs, labels):
                self._counts[(cns, reqs)] += 1

    def remove_pod(self, uid: str) -> None:
        self._ips.pop(uid, None)
        if self.addresses is not None:
            self.addresses.release(uid)
        entry = self.pods.pop(uid, None)
        if entry is None:
            return
        cpu, mem, labels, ns = entry
        self.used_cpu -= cpu
        self.used_mem -= mem
        for cns, reqs in self._counts:
            if cns == ns and labels_match(reqs, labels):
                self._counts[(cns, reqs)] -= 1

    def fits(self, cpu: int, mem: int) -> bool:
        return (
            not self.unreachable
            and len(self.pods) < self.spec.max_pods
            and self.used_cpu + cpu <= self.cpu_millis
            and self.used_mem + mem <= self.memory_bytes
        )

    def score_after(self, cpu: int, mem: int) -> float:
        return (
            (self.used_cpu + cpu) / max(1, self.cpu_millis)
            + (self.used_mem + mem) / max(1, self.memory_bytes)
        ) / 2

    def count(self, namespace: str, reqs: tuple[Requirement, ...]) -> int:
        key = (namespace, reqs)
        if key not in self._counts:
            self._counts[key] = sum(
                1
                for _, _, labels, ns in self.pods.values()
                if ns == namespace and labels_match(reqs, labels)
            )
        return self._counts[key]

    def recent_binds(self, now: float, window_s: float) -> int:
        while self.binds and self.binds[0] < now - window_s:
            self.binds.popleft()
        return len(self.binds)

    def pod_ip(self, uid: str) -> str:
        """The pod's own address on this node (the same one if asked again), never shared."""
        held = self._ips.get(uid)
        if held is not None:
            return held
        taken = set(self._ips.values())
        prefix = f"127.{self.pod_block // 256}.{self.pod_block % 256}."
        for _ in range(253):
            host = self._next_host
            self._next_host = 2 if host >= 254 else host + 1
            if prefix + str(host) not in taken:
                self._ips[uid] = prefix + str(host)
                return prefix + str(host)
        raise RuntimeError(f"{self.name}: the pod range {prefix}0/24 is exhausted")

    def summary(self) -> dict[str, Any]:
        cpu, mem = self.allocated()
        return {
            "name": self.name,
            "ip": self.ip,
            "cpu_millis": self.cpu_millis,
            "memory_bytes": self.memory_bytes,
            "allocated_cpu_millis": cpu,
            "allocated_memory_bytes": mem,
            "pods": len(self.pods),
            "images": sorted(self.images),
            "address_failures": self.address_failures,
            "ready": "Unknown" if self.unreachable else "True",
            "labels": self.labels,
            **({} if self.addresses is None else self.addresses.summary()),
        }


def make_nodes(nodes: int | list[NodeSpec], *, pod_range: int = 1) -> list[NodeState]:
    """Nodes; node i's pods get addresses from /24 block ``pod_range + i`` of 127.0.0.0/8
    (block 0, which holds 127.0.0.1, is skipped)."""
    specs = [NodeSpec(f"node-{i}") for i in range(nodes)] if isinstance(nodes, int) else nodes
    blocks = 256 * 256 - 1
    return [
        NodeState(
            spec,
            i,
            round(quantity(spec.cpu) * 1000),
            round(quantity(spec.memory)),
            pod_block=(pod_range - 1 + i) % blocks + 1,
        )
        for i, spec in enumerate(specs)
    ]


def attach_subnets(
    nodes: list[NodeState], specs: list[SubnetSpec], *, warm_ip_target: int
) -> list[Subnet]:
    """Node i joins subnet ``i % len(specs)`` (the VPC CNI then holds its addresses there)."""
    subnets = [Subnet(spec) for spec in specs]
    for i, node in enumerate(nodes):
        node.addresses = NodeAddresses(subnets[i % len(subnets)], warm_ip_target)
        node.addresses.attach()
    return subnets


class Scheduler:
    def __init__(self, nodes: list[NodeState]) -> None:
        self.nodes = nodes
        self._by_name = {n.name: n for n in nodes}

    def node(self, name: str) -> NodeState | None:
        return self._by_name.get(name)

    def pick(self, pod: Mapping[str, Any]) -> NodeState | None:
        spec = pod.get("spec") or {}
        namespace = pod["metadata"]["namespace"]
        cpu, mem = pod_requests(spec)
        wanted = spec.get("nodeName")
        if wanted:
            node = self._by_name.get(wanted)
            return node if node is not None and node.fits(cpu, mem) else None
        selector = spec.get("nodeSelector") or {}
        feasible = [
            n
            for n in self.nodes
            if n.fits(cpu, mem) and all(n.labels.get(k) == v for k, v in selector.items())
        ]
        for tsc in spec.get("topologySpreadConstraints") or []:
            if tsc.get("topologyKey") != HOSTNAME or not feasible:
                continue
            reqs = selector_requirements(tsc.get("labelSelector"))
            counts = {n.name: n.count(namespace, reqs) for n in self.nodes}
            low = min(counts.values())
            skew = int(tsc.get("maxSkew", 1))
            within = [n for n in feasible if counts[n.name] + 1 - low <= skew]
            if within or tsc.get("whenUnsatisfiable", "DoNotSchedule") == "DoNotSchedule":
                feasible = within
        if not feasible:
            return None
        best = max(feasible, key=lambda n: (n.score_after(cpu, mem), -n.index))
        return best

    def bind(self, node: NodeState, pod: Mapping[str, Any], now: float) -> None:
        meta = pod["metadata"]
        cpu, mem = pod_requests(pod.get("spec") or {})
        node.add_pod(meta["uid"], cpu, mem, dict(meta.get("labels") or {}), meta["namespace"])
        node.binds.append(now)

    def mark_unreachable(self, name: str) -> None:
        node = self._by_name.get(name)
        if node is not None:
            node.unreachable = True

    def release(self, node_name: str | None, uid: str) -> None:
        node = self._by_name.get(node_name or "")
        if node is not None:
            node.remove_pod(uid)
