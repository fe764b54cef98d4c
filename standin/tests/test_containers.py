"""The stand-in's kubelet runs what a pod's spec says, at the pod's own address.

Each test names the Kubernetes documentation it imitates:

* "Cluster Networking" / "The Kubernetes network model",
  https://kubernetes.io/docs/concepts/cluster-administration/networking/ -- every pod gets its
  own IP address; the stand-in's are loopback addresses from a per-node range, never
  127.0.0.1.
* "Define Dependent Environment Variables",
  https://kubernetes.io/docs/tasks/inject-data-application/define-interdependent-environment-variables/
  -- ``$(VAR)`` references, unresolved ones unchanged, ``$$`` as the escape.
* "Expose Pod Information to Containers Through Environment Variables",
  https://kubernetes.io/docs/tasks/inject-data-application/environment-variable-expose-pod-information/
  -- ``fieldRef`` ``status.podIP`` and ``metadata.name``.
* "Configure Liveness, Readiness and Startup Probes",
  https://kubernetes.io/docs/tasks/configure-pod-container/configure-liveness-readiness-startup-probes/
  -- an ``httpGet`` probe connects to the pod's IP ("host: Host name to connect to, defaults
  to the pod IP"), a status from 200 to 399 is success.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubernetes import client, watch

from standin import StandinCluster
from standin.containers import container_env, expand
from standin.tests.conftest import NS, core_for, pod

SERVER = (
    "import http.server, sys\n"
    "class H(http.server.BaseHTTPRequestHandler):\n"
    "    def do_GET(self):\n"
    "        self.send_response(200); self.end_headers(); self.wfile.write(b'ok')\n"
    "    def log_message(self, *a): pass\n"
    "server = http.server.HTTPServer((sys.argv[1], int(sys.argv[2])), H)\n"
    "if len(sys.argv) > 3:\n"
    "    open(sys.argv[3], 'w').write('bound')  # a fifo: the test reads it once bound\n"
    "server.serve_forever()\n"
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _serving_pod(name: str, host: str, port: int, *extra: str) -> dict[str, Any]:
    """A pod whose container serves ``/health`` on ``host`` (``$(POD_IP)`` or a literal)."""
    body = pod(name)
    container = body["spec"]["containers"][0]
    container.update(
        command=["python3", "-c", SERVER, host, str(port), *extra],
        env=[
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        ],
        ports=[{"name": "http", "containerPort": port}],
        readinessProbe={"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 1},
    )
    return body


def _wait_ready(core: client.CoreV1Api, name: str) -> dict[str, Any]:
    for event in watch.Watch().stream(
        core.list_namespaced_pod,
        NS,
        field_selector=f"metadata.name={name}",
        timeout_seconds=60,
        _preload_content=False,
    ):
        obj = event["raw_object"]
        conds = {c["type"]: c["status"] for c in obj["status"].get("conditions") or []}
        assert obj["status"]["phase"] != "Failed", obj["status"]
        if conds.get("Ready") == "True":
            return obj
    raise AssertionError(f"{name} never became Ready")


def test_every_pod_gets_its_own_loopback_address_from_its_nodes_range(
    make_cluster: Callable[..., StandinCluster],
) -> None:
    """The Kubernetes network model: each pod has its own IP (here 127.x.y.z, not .0.1)."""
    cluster = make_cluster(nodes=2)
    core = core_for(cluster)
    try:
        for i in range(6):
            core.create_namespaced_pod(NS, pod(f"p{i}", cpu="4", memory="1Gi"))
        cluster.run_until_idle()
    finally:
        core.api_client.close()
    pods = cluster.pods(NS)
    ips = [p["status"]["podIP"] for p in pods]
    assert len(set(ips)) == 6 and "127.0.0.1" not in ips
    assert all(ipaddress.ip_address(ip) in ipaddress.ip_network("127.0.0.0/8") for ip in ips)
    assert all(p["status"]["podIPs"] == [{"ip": p["status"]["podIP"]}] for p in pods)
    by_node: dict[str, set[str]] = {}
    for p in pods:
        by_node.setdefault(p["spec"]["nodeName"], set()).add(p["status"]["podIP"].rsplit(".", 1)[0])
    assert len(by_node) == 2 and all(len(prefixes) == 1 for prefixes in by_node.values())
    assert len(set().union(*by_node.values())) == 2  # one /24 per node


def test_dependent_variables_expand_as_the_kubernetes_docs_example() -> None:
    """ "Define Dependent Environment Variables": the page's own example, verbatim values."""
    container = {
        "env": [
            {"name": "SERVICE_PORT", "value": "80"},
            {"name": "SERVICE_IP", "value": "172.17.0.1"},
            {"name": "UNCHANGED_REFERENCE", "value": "$(PROTOCOL)://$(SERVICE_IP):$(SERVICE_PORT)"},
            {"name": "PROTOCOL", "value": "https"},
            {"name": "SERVICE_ADDRESS", "value": "$(PROTOCOL)://$(SERVICE_IP):$(SERVICE_PORT)"},
            {"name": "ESCAPED_REFERENCE", "value": "$$(PROTOCOL)://$(SERVICE_IP):$(SERVICE_PORT)"},
        ]
    }
    env = container_env({"metadata": {}}, container, lambda name: None)
    assert env["UNCHANGED_REFERENCE"] == "$(PROTOCOL)://172.17.0.1:80"
    assert env["SERVICE_ADDRESS"] == "https://172.17.0.1:80"
    assert env["ESCAPED_REFERENCE"] == "$(PROTOCOL)://172.17.0.1:80"
    assert expand("--host $(POD_IP) --x $(NOPE)", {"POD_IP": "127.3.4.5"}) == (
        "--host 127.3.4.5 --x $(NOPE)"
    )


def test_downward_api_gives_the_pod_its_ip_and_name() -> None:
    """ "Expose Pod Information to Containers Through Environment Variables"."""
    the_pod = {
        "metadata": {"name": "sb-1", "namespace": NS, "labels": {"app": "x"}},
        "spec": {"nodeName": "node-0"},
        "status": {"podIP": "127.9.0.2"},
    }
    container = {
        "env": [
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
            {"name": "ADDR", "value": "$(POD_IP):8700"},
        ]
    }
    assert container_env(the_pod, container, lambda name: None) == {
        "POD_IP": "127.9.0.2",
        "NAME": "sb-1",
        "APP": "x",
        "ADDR": "127.9.0.2:8700",
    }


def test_a_process_bound_to_the_pod_ip_passes_its_readiness_probe(
    make_cluster: Callable[..., StandinCluster],
) -> None:
    """Readiness probe docs: httpGet goes to podIP:port; the container binds $(POD_IP)."""
    cluster = make_cluster(nodes=1, run_execd=True)
    core = core_for(cluster)
    try:
        core.create_namespaced_pod(NS, _serving_pod("good", "$(POD_IP)", _free_port()))
        ready = _wait_ready(core, "good")
    finally:
        core.api_client.close()
    ip = ready["status"]["podIP"]
    assert ip != "127.0.0.1" and ready["status"]["phase"] == "Running"


def test_a_process_bound_to_127_0_0_1_is_not_reached_at_the_pod_ip_and_never_ready(
    make_cluster: Callable[..., StandinCluster], tmp_path: Path
) -> None:
    """Readiness probe docs: the kubelet probes the pod IP, so a loopback-only listener
    fails every probe. A second probe being reached proves the first one failed (a passing
    probe ends probing with Ready); the first is released only once the process is bound."""
    cluster = make_cluster(nodes=1, run_execd=True)
    port = _free_port()
    bound = tmp_path / "bound.fifo"
    os.mkfifo(bound)
    core = core_for(cluster)
    first = cluster.gates.add("probe", lambda ctx: ctx.name == "lonely")
    try:
        core.create_namespaced_pod(NS, _serving_pod("lonely", "127.0.0.1", port, str(bound)))
        first.wait_reached()
        with open(bound) as fh:  # returns once the process has bound its socket
            assert fh.read() == "bound"
        # The process is up: it answers on 127.0.0.1, not at its pod's address.
        with socket.create_connection(("127.0.0.1", port), timeout=10):
            pass
        second = cluster.gates.add("probe", lambda ctx: ctx.name == "lonely")
        first.release()
        second.wait_reached()
        ip = cluster.pod(NS, "lonely")["status"]["podIP"]  # type: ignore[index]
        try:
            socket.create_connection((ip, port), timeout=10).close()
            refused = False
        except ConnectionRefusedError:
            refused = True
        assert refused
        status = cluster.pod(NS, "lonely")["status"]  # type: ignore[index]
        conds = {c["type"]: c["status"] for c in status["conditions"]}
        assert status["phase"] == "Running" and conds["Ready"] == "False"
        second.release()
    finally:
        core.api_client.close()


def test_a_container_that_exits_fails_its_pod(make_cluster: Callable[..., StandinCluster]) -> None:
    """restartPolicy Never: a main container that exits leaves the pod Failed."""
    cluster = make_cluster(nodes=1, run_execd=True)
    core = core_for(cluster)
    body = pod("quits")
    body["spec"]["restartPolicy"] = "Never"
    body["spec"]["containers"][0]["command"] = ["sh", "-c", "echo bye >&2; exit 3"]
    try:
        core.create_namespaced_pod(NS, body)
        for event in watch.Watch().stream(
            core.list_namespaced_pod, NS, timeout_seconds=60, _preload_content=False
        ):
            if event["raw_object"]["status"].get("phase") == "Failed":
                status = event["raw_object"]["status"]
                break
        else:
            raise AssertionError("the pod never failed")
    finally:
        core.api_client.close()
    assert "exited with code 3" in status["message"] and "bye" in status["message"]
