"""``manage.py standin_cluster``: serve a stand-in Kubernetes API until SIGINT/SIGTERM.

It writes a kubeconfig pointing at itself (plain HTTP on loopback, no credentials), so
``SANDMAN_BACKEND=kubernetes KUBECONFIG=FILE`` runs Sandman's kubernetes provider against
it. The simulation runs in real time (``--speed`` scales it); with ``--run-execd`` every
pod that becomes Ready runs a real execd on loopback, reached at ``status.podIP``
(127.0.0.1) and the port in its ``sandman.dev/execd-port`` annotation.

Invariant: the command serves from its own event loop in the main thread and always
stops the cluster (and with it every execd child) before it exits.
"""

from __future__ import annotations

import asyncio
import signal
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser

from standin import AddressModel, NodeSpec, StandinCluster
from standin.kubeconfig import write_kubeconfig


class Command(BaseCommand):
    help = "Serve a stand-in Kubernetes cluster (pods API, scheduler, kubelet) for rehearsal."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--kubeconfig", required=True, help="where to write the kubeconfig")
        parser.add_argument(
            "--namespace", default=None, help="kubeconfig namespace (default SANDMAN_NAMESPACE)"
        )
        parser.add_argument("--nodes", type=int, default=3)
        parser.add_argument("--node-cpu", default="16")
        parser.add_argument("--node-memory", default="64Gi")
        parser.add_argument(
            "--warm-addresses", type=int, default=2, help="spare pod addresses per node"
        )
        parser.add_argument(
            "--run-execd", action="store_true", help="run a real execd per Ready pod"
        )
        parser.add_argument("--seed", type=int, default=0)
        parser.add_argument(
            "--speed", type=float, default=1.0, help="simulated seconds per wall second"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        nodes = [
            NodeSpec(f"node-{i}", cpu=options["node_cpu"], memory=options["node_memory"])
            for i in range(options["nodes"])
        ]
        cluster = StandinCluster(
            nodes,
            mode="realtime",
            speed=options["speed"],
            seed=options["seed"],
            address_model=AddressModel(warm_addresses=options["warm_addresses"]),
            run_execd=options["run_execd"],
            host=options["host"],
            port=options["port"],
        )
        namespace = options["namespace"] or getattr(settings, "SANDMAN_NAMESPACE", "default")
        asyncio.run(self._serve(cluster, options["kubeconfig"], namespace))

    async def _serve(self, cluster: StandinCluster, kubeconfig: str, namespace: str) -> None:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        url = await cluster.start_async()
        try:
            path = write_kubeconfig(kubeconfig, url, namespace=namespace)
            self.stdout.write(f"stand-in cluster listening on {url}; kubeconfig {path}")
            self.stdout.flush()
            await stop.wait()
        finally:
            await cluster.stop_async()
        self.stdout.write("stand-in cluster stopped")
