"""Disruptions of Running pods the stand-in can stage: eviction, a lost node, a failing probe.

* ``evict`` -- node-pressure eviction by the kubelet (Kubernetes -- Node-pressure
  Eviction): phase Failed, ``status.reason`` Evicted and the eviction manager's message,
  a ``DisruptionTarget`` condition (TerminationByKubelet), Ready False, a Warning
  ``Evicted`` Event. The pod stays stored (Failed pods are not deleted by the kubelet).
* ``lose_node`` -- the node stops posting status (Kubernetes -- Nodes, "Node status"):
  the node is Ready Unknown and takes no new pods; the node lifecycle controller marks
  its pods Ready False and records ``NodeNotReady`` "Node is not ready" on each.
* ``fail_probe`` -- a readiness probe starts failing: Ready and ContainersReady False
  (ContainersNotReady), a Warning ``Unhealthy`` "Readiness probe failed: ..." Event.

Every disruption stops the kubelet's simulation of the pod first (``Kubelet.stop``), so
no later stage writes over it. Runs on the cluster's loop, like the kubelet.
"""

from __future__ import annotations

from collections.abc import Callable

from standin.events import EventLog
from standin.kubelet import Kubelet
from standin.podstatus import main_container, set_condition
from standin.store import Obj, Store

NODE_CONTROLLER = "node-controller"


def _with_message(pod: Obj, ctype: str, value: bool, when: str, reason: str, text: str) -> None:
    set_condition(pod["status"], ctype, value, when, reason)
    for cond in pod["status"]["conditions"]:
        if cond["type"] == ctype:
            cond["message"] = text


class Disruptions:
    def __init__(
        self, *, store: Store, kubelet: Kubelet, events: EventLog, when: Callable[[], str]
    ) -> None:
        self.store, self.kubelet, self.events, self.when = store, kubelet, events, when
        self.lost_nodes: set[str] = set()

    def evict(self, namespace: str, name: str) -> bool:
        pod = self.store.get("pods", namespace, name)
        if pod is None:
            return False
        node = self.kubelet.stop(pod["metadata"]["uid"])
        container = main_container(pod).get("name", "sandbox")
        text = (
            "The node was low on resource: memory. Threshold quantity: 100Mi, available:"
            f" 51200Ki. Container {container} was using 1048576Ki, request is 1Gi, has larger"
            " consumption of memory."
        )
        when = self.when()

        def evicted(p: Obj) -> None:
            st = p["status"]
            st.update(phase="Failed", reason="Evicted", message=text)
            _with_message(p, "DisruptionTarget", True, when, "TerminationByKubelet", text)
            set_condition(st, "ContainersReady", False, when, "PodFailed")
            set_condition(st, "Ready", False, when, "PodFailed")

        stored = self.store.update("pods", namespace, name, evicted)
        if stored is not None:
            self.events.add("Evicted", stored, text, type="Warning", node=node)
        return stored is not None

    def lose_node(self, node: str) -> int:
        """Mark ``node`` lost; returns how many of its pods were marked not Ready."""
        self.lost_nodes.add(node)
        self.kubelet.scheduler.mark_unreachable(node)
        when, marked = self.when(), 0
        for pod in list(self.store.items("pods")):
            if (pod.get("spec") or {}).get("nodeName") != node:
                continue
            meta = pod["metadata"]
            self.kubelet.stop(meta["uid"], release=False)  # the node keeps them, unreachable

            def not_ready(p: Obj) -> None:
                set_condition(p["status"], "Ready", False, when)

            stored = self.store.update("pods", meta["namespace"], meta["name"], not_ready)
            if stored is not None:
                marked += 1
                self.events.add(
                    "NodeNotReady",
                    stored,
                    "Node is not ready",
                    type="Warning",
                    component=NODE_CONTROLLER,
                )
        return marked

    def fail_probe(self, namespace: str, name: str) -> bool:
        pod = self.store.get("pods", namespace, name)
        if pod is None:
            return False
        node = self.kubelet.stop(pod["metadata"]["uid"], release=False)
        main = main_container(pod)
        ip = pod["status"].get("podIP", "")
        port = ((main.get("readinessProbe") or {}).get("httpGet") or {}).get("port", 8700)
        text = (
            f'Readiness probe failed: Get "http://{ip}:{port}/health": dial tcp {ip}:{port}:'
            " connect: connection refused"
        )
        when = self.when()

        def unready(p: Obj) -> None:
            set_condition(p["status"], "ContainersReady", False, when, "ContainersNotReady")
            set_condition(p["status"], "Ready", False, when, "ContainersNotReady")
            for cs in p["status"].get("containerStatuses") or []:
                cs["ready"] = False

        stored = self.store.update("pods", namespace, name, unready)
        if stored is not None:
            path = f"spec.containers{{{main.get('name', 'sandbox')}}}"
            self.events.add("Unhealthy", stored, text, type="Warning", node=node, field_path=path)
        return stored is not None
