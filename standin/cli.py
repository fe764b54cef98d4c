"""Serve a stand-in cluster from the command line until SIGINT/SIGTERM.

``python -m standin --kubeconfig FILE [--port 0] [--run-execd] ...`` (and the thin
``manage.py standin_cluster`` wrapper, which adds Sandman's namespace as the default)
writes a kubeconfig pointing at the cluster (plain HTTP on loopback, no credentials), so
``SANDMAN_BACKEND=kubernetes KUBECONFIG=FILE`` runs Sandman's kubernetes provider
against it. The simulation runs in real time (``--speed`` scales it); with
``--run-execd`` every pod's containers run as real processes started from its spec, and
each pod has its own loopback address (``status.podIP``, in 127.0.0.0/8, never 127.0.0.1)
that its process must bind to be reached and to pass its readiness probe.

Invariant: :func:`serve` runs the cluster on the calling thread's event loop and always
stops it (and with it every execd child) before it returns.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import signal
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from standin.cluster import StandinCluster
from standin.kubeconfig import write_kubeconfig
from standin.scheduler import AddressModel, NodeSpec
from standin.subnets import SubnetSpec

DEFAULT_NAMESPACE = "default"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``python -m standin`` and of ``manage.py standin_cluster``."""
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--kubeconfig", required=True, help="where to write the kubeconfig")
    parser.add_argument(
        "--namespace",
        default=None,
        help="the kubeconfig's namespace (default: 'default'; SANDMAN_NAMESPACE under manage.py)",
    )
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--node-cpu", default="16")
    parser.add_argument("--node-memory", default="64Gi")
    parser.add_argument(
        "--warm-addresses", type=int, default=2, help="spare pod addresses per node"
    )
    parser.add_argument(
        "--subnet",
        action="append",
        default=[],
        metavar="ID=CIDR[@ZONE]",
        help="a VPC subnet the nodes join round-robin (repeat; none: addresses unbounded)",
    )
    parser.add_argument(
        "--warm-ip-target", type=int, default=1, help="the VPC CNI's WARM_IP_TARGET per node"
    )
    parser.add_argument(
        "--node-label",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a label on every node (repeat), e.g. sandman.dev/node-pool=sandboxes",
    )
    parser.add_argument("--run-execd", action="store_true", help="run a real execd per Ready pod")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--speed", type=float, default=1.0, help="simulated seconds per wall second"
    )


def cluster_from_options(options: Mapping[str, Any]) -> StandinCluster:
    """A real-time cluster as the options describe (keys are the argparse ``dest`` names)."""
    labels = dict(item.split("=", 1) for item in options.get("node_label") or [])
    nodes = [
        NodeSpec(f"node-{i}", cpu=options["node_cpu"], memory=options["node_memory"], labels=labels)
        for i in range(options["nodes"])
    ]
    subnets = [_subnet(item) for item in options.get("subnet") or []]
    return StandinCluster(
        nodes,
        mode="realtime",
        speed=options["speed"],
        seed=options["seed"],
        address_model=AddressModel(warm_addresses=options["warm_addresses"]),
        subnets=subnets,
        warm_ip_target=options.get("warm_ip_target", 1),
        run_execd=options["run_execd"],
        host=options["host"],
        port=options["port"],
    )


def _subnet(item: str) -> SubnetSpec:
    """``ID=CIDR[@ZONE]`` as a subnet (ValueError on another shape)."""
    subnet_id, _, rest = item.partition("=")
    cidr, _, zone = rest.partition("@")
    if not subnet_id or not cidr:
        raise ValueError(f"--subnet {item!r}: expected ID=CIDR[@ZONE]")
    ipaddress.ip_network(cidr)  # ValueError for a CIDR that is not one
    return SubnetSpec(subnet_id, cidr, zone or "standin-1a")


async def serve(
    cluster: StandinCluster, kubeconfig: str, namespace: str, say: Callable[[str], None]
) -> None:
    """Serve ``cluster`` until SIGINT/SIGTERM; ``say`` reports listening and stopped."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    url = await cluster.start_async()
    try:
        path = write_kubeconfig(kubeconfig, url, namespace=namespace)
        say(f"stand-in cluster listening on {url}; kubeconfig {path}")
        await stop.wait()
    finally:
        await cluster.stop_async()
    say("stand-in cluster stopped")


def run(options: Mapping[str, Any], say: Callable[[str], None], *, namespace: str) -> None:
    """Build the cluster from ``options`` and serve it; ``namespace`` if none was given."""
    cluster = cluster_from_options(options)
    asyncio.run(serve(cluster, options["kubeconfig"], options["namespace"] or namespace, say))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m standin",
        description="Serve a stand-in Kubernetes cluster (pods API, scheduler, kubelet).",
    )
    add_arguments(parser)
    options = vars(parser.parse_args(argv))
    run(options, lambda line: print(line, flush=True), namespace=DEFAULT_NAMESPACE)
