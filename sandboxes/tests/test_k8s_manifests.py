"""The ``k8s/`` manifests render and deserialise into the official client's models.

Rendered with ``kubectl kustomize k8s/`` when kubectl exists; otherwise the files listed in
``kustomization.yaml`` are loaded with PyYAML (CI may lack kubectl). Every object must map
to a known model class and survive a round trip without losing a field (a dropped field
means a typo or a field the API does not know).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from sandboxes import labels as L
from sandboxes.providers.base import SandboxSpec
from sandboxes.providers.kubernetes import KubernetesConfig, build_pod_manifest

K8S = Path(__file__).resolve().parents[2] / "k8s"
MODELS = {
    "Namespace": "V1Namespace",
    "ServiceAccount": "V1ServiceAccount",
    "Role": "V1Role",
    "RoleBinding": "V1RoleBinding",
    "ConfigMap": "V1ConfigMap",
    "Deployment": "V1Deployment",
    "Service": "V1Service",
    "NetworkPolicy": "V1NetworkPolicy",
    "StatefulSet": "V1StatefulSet",
    "PodDisruptionBudget": "V1PodDisruptionBudget",
}
POD_VERBS = {"create", "get", "list", "watch", "patch", "delete"}
ANCHOR_VERBS = {"create", "get", "list", "watch", "delete"}
SECRET_VERBS = {"create", "list", "delete"}  # the job's key Secret: never read back
EVENT_VERBS = {"get", "list", "watch"}  # read-only: the provider reads core/v1 Events


def _render() -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    if kubectl:
        out = subprocess.run(
            [kubectl, "kustomize", str(K8S)], check=True, capture_output=True, text=True, timeout=60
        )
        docs = yaml.safe_load_all(out.stdout)
    else:
        kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
        docs = (
            d
            for name in kustomization["resources"]
            for d in yaml.safe_load_all((K8S / name).read_text())
        )
    return [d for d in docs if d]


@pytest.fixture(scope="module")
def objects() -> list[dict[str, Any]]:
    return _render()


def _find(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return next(o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name)


def _lost_fields(original: Any, round_trip: Any, path: str = "") -> list[str]:
    if isinstance(original, dict):
        if not isinstance(round_trip, dict):
            return [path or "/"]
        lost = []
        for key, value in original.items():
            if key not in round_trip:
                lost.append(f"{path}/{key}")
            else:
                lost += _lost_fields(value, round_trip[key], f"{path}/{key}")
        return lost
    if isinstance(original, list):
        if not isinstance(round_trip, list) or len(original) != len(round_trip):
            return [path]
        return [
            x for a, b in zip(original, round_trip, strict=True) for x in _lost_fields(a, b, path)
        ]
    return [] if str(original) == str(round_trip) else [f"{path}={original!r}"]


def _round_trip(doc: dict[str, Any]) -> list[str]:
    api = client.ApiClient()
    model = api.deserialize(
        json.dumps(doc), {**MODELS, "Pod": "V1Pod"}[doc["kind"]], "application/json"
    )
    return _lost_fields(doc, api.sanitize_for_serialization(model))


def test_every_object_is_a_known_kind_and_deserialises_without_losing_fields(
    objects: list[dict[str, Any]],
) -> None:
    assert objects
    unknown = sorted({o["kind"] for o in objects} - set(MODELS))
    assert unknown == [], f"no model mapping for {unknown}"
    for doc in objects:
        assert _round_trip(doc) == [], f"{doc['kind']}/{doc['metadata']['name']}"


def test_the_role_grants_exactly_pods_anchor_configmaps_job_secrets_and_reading_events(
    objects: list[dict[str, Any]],
) -> None:
    role = _find(objects, "Role", "sandman-sandboxes")
    assert role["metadata"]["namespace"] == "sandman-sandboxes"
    rules = {(tuple(r["apiGroups"]), tuple(r["resources"])): set(r["verbs"]) for r in role["rules"]}
    assert rules == {
        (("",), ("pods",)): POD_VERBS,
        (("",), ("configmaps",)): ANCHOR_VERBS,
        (("",), ("secrets",)): SECRET_VERBS,
        (("",), ("events",)): EVENT_VERBS,
    }
    assert not [o for o in objects if o["kind"] in ("ClusterRole", "ClusterRoleBinding")]
    binding = _find(objects, "RoleBinding", "sandman-sandboxes")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "sandman", "namespace": "sandman"}
    ]


def _containers(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    pod = _find(objects, "Deployment", "sandman")["spec"]["template"]["spec"]
    return {c["name"]: c for c in pod["containers"]}


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e for e in container["env"]}


def test_each_replica_runs_the_controller_process_and_uvicorn_workers_sharing_its_socket(
    objects: list[dict[str, Any]],
) -> None:
    """docs/architecture.md §3.1: ``manage.py run_controller`` and ``uvicorn --workers N``,
    two containers of one pod, the socket in an emptyDir both mount at the directory of
    ``SANDMAN_CONTROLLER_SOCKET`` (the same value in both)."""
    pod = _find(objects, "Deployment", "sandman")["spec"]["template"]["spec"]
    containers = _containers(objects)
    assert set(containers) == {"controller", "web"}
    controller, web = containers["controller"], containers["web"]
    assert controller["command"][-2:] == ["manage.py", "run_controller"]
    assert web["command"][0] == "uvicorn" and web["command"][-1] == "sandman_site.asgi:application"
    assert any(arg.startswith("--workers=") for arg in web["command"])
    assert controller["image"] == web["image"]
    socket_path = {_env(c)["SANDMAN_CONTROLLER_SOCKET"]["value"] for c in (controller, web)}
    (path,) = socket_path
    volumes = {v["name"]: v for v in pod["volumes"]}
    for container in (controller, web):
        (mount,) = [
            m for m in container["volumeMounts"] if str(Path(path).parent) == m["mountPath"]
        ]
        assert "emptyDir" in volumes[mount["name"]]
    for container in (controller, web):
        env = _env(container)
        assert env["DATABASE_URL"]["valueFrom"]["secretKeyRef"]["name"] == "sandman-db"
        assert env["SANDMAN_SECRET_KEY"]["valueFrom"]["secretKeyRef"]["name"] == "sandman-app"
        assert env["SANDMAN_BACKEND"]["value"] == "kubernetes"
        assert (
            env["SANDMAN_NAMESPACE"]["value"]
            == _find(objects, "Role", "sandman-sandboxes")["metadata"]["namespace"]
        )
        assert (
            env["SANDMAN_EXECD_CARRIER_IMAGE"]["valueFrom"]["configMapKeyRef"]["name"]
            == "sandman-execd-carrier"
        )
    assert "ports" not in controller  # it serves no HTTP; the Services target web's port
    assert [p["name"] for p in web["ports"]] == ["http"]
    assert pod["serviceAccountName"] == "sandman"
    # The kubelet's SIGKILL comes after the controller's stop (runner <= 10 s) and uvicorn's.
    graceful = next(a for a in web["command"] if a.startswith("--timeout-graceful-shutdown="))
    assert int(graceful.split("=")[1]) < pod["terminationGracePeriodSeconds"]


def test_the_probes_ask_each_process_what_it_serves(objects: list[dict[str, Any]]) -> None:
    """The web container: Ready and live on ``/healthz`` (a standby is Ready: the PDB and
    the pages' Service count it). The controller: no readiness probe (a container without
    one is Ready once running: a standby must not make its pod unready), liveness an exec
    ``ping`` on its socket (run for real in ``test_controller_liveness_probe_*`` below)."""
    controller, web = _containers(objects)["controller"], _containers(objects)["web"]
    for kind in ("readinessProbe", "livenessProbe"):
        assert web[kind]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert "readinessProbe" not in controller
    assert controller["livenessProbe"]["exec"]["command"][:2] == ["python", "-c"]


def _run_liveness_probe(objects: list[dict[str, Any]], path: Path) -> int:
    command = _containers(objects)["controller"]["livenessProbe"]["exec"]["command"]
    env = {"SANDMAN_CONTROLLER_SOCKET": str(path), "PATH": os.environ["PATH"]}
    command = [sys.executable, *command[1:]]  # the image's python is this one's
    return subprocess.run(command, env=env, timeout=60, capture_output=True).returncode


def test_controller_liveness_probe_passes_without_a_listener_and_fails_on_a_silent_one(
    objects: list[dict[str, Any]], tmp_path: Path
) -> None:
    """A standby (no socket), a socket file left by a killed process (nothing listens):
    alive. A listener that accepts and never answers (a wedged loop): not alive. An
    answer to the ping: alive (the real controller process: test_controller_failover.py)."""
    path = tmp_path / "controller.sock"
    assert _run_liveness_probe(objects, path) == 0
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as silent:
        silent.bind(str(path))
        silent.listen(1)
        assert _run_liveness_probe(objects, path) != 0
    assert path.exists()  # left behind, nothing listening
    assert _run_liveness_probe(objects, path) == 0
    path.unlink()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(str(path))
        server.listen(1)

        def answer() -> None:
            conn, _ = server.accept()
            with conn:
                conn.makefile("rb").readline()
                conn.sendall(b'{"id": 1, "ok": {"started": true}}\n')

        thread = threading.Thread(target=answer)
        thread.start()
        assert _run_liveness_probe(objects, path) == 0
        thread.join(60)


def test_two_replicas_elect_a_leader_on_a_lease_and_trainers_reach_only_the_leader(
    objects: list[dict[str, Any]],
) -> None:
    """docs/architecture.md §4.1: every replica is Ready when it serves; the trainers'
    Service selects the leader's label, the pages' Service any replica; a PDB keeps one."""
    deployment = _find(objects, "Deployment", "sandman")
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    labels = deployment["spec"]["selector"]["matchLabels"]
    env = _env(_containers(objects)["controller"])  # the elector runs in the controller
    assert env["SANDMAN_REPLICA_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["SANDMAN_POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == (
        "metadata.namespace"
    )
    trainers = _find(objects, "Service", "sandman")["spec"]["selector"]
    assert trainers == {**labels, L.LEADER: "true"}
    assert _find(objects, "Service", "sandman-pages")["spec"]["selector"] == labels
    pdb = _find(objects, "PodDisruptionBudget", "sandman")
    assert pdb["spec"]["minAvailable"] == 1 and pdb["spec"]["selector"]["matchLabels"] == labels
    role = _find(objects, "Role", "sandman-leader-election")
    assert role["metadata"]["namespace"] == deployment["metadata"]["namespace"]
    rules = {(tuple(r["apiGroups"]), tuple(r["resources"])): set(r["verbs"]) for r in role["rules"]}
    assert rules == {
        (("coordination.k8s.io",), ("leases",)): {"get", "create", "update"},
        (("",), ("pods",)): {"get", "patch"},
    }
    binding = _find(objects, "RoleBinding", "sandman-leader-election")
    assert binding["roleRef"]["name"] == "sandman-leader-election"
    assert (
        binding["subjects"][0]["name"]
        == deployment["spec"]["template"]["spec"]["serviceAccountName"]
    )
    redis = _find(objects, "Service", "redis")
    port = redis["spec"]["ports"][0]["port"]
    for container in _containers(objects).values():  # the controller publishes, web pushes
        assert _env(container)["SANDMAN_REDIS_URL"]["value"] == (
            f"redis://redis.{redis['metadata']['namespace']}.svc:{port}/0"
        )
    assert _find(objects, "Deployment", "redis")["spec"]["replicas"] == 1


def test_network_policies_deny_egress_and_admit_execd_only_from_trainers(
    objects: list[dict[str, Any]],
) -> None:
    deny = _find(objects, "NetworkPolicy", "sandbox-deny-egress")
    assert deny["spec"]["podSelector"]["matchLabels"][L.EGRESS] == "deny"
    assert deny["spec"]["policyTypes"] == ["Egress"] and deny["spec"]["egress"] == []
    ingress = _find(objects, "NetworkPolicy", "sandbox-execd-ingress")
    (rule,) = ingress["spec"]["ingress"]
    assert [p["port"] for p in rule["ports"]] == [KubernetesConfig().execd_port]
    sources = [peer["podSelector"]["matchLabels"] for peer in rule["from"]]
    assert {L.TRAINER: "true"} in sources and {"sandman.dev/controller": "true"} in sources
    controller = _find(objects, "Deployment", "sandman")["spec"]["template"]["metadata"]["labels"]
    assert controller["sandman.dev/controller"] == "true"


def test_the_round_trip_notices_a_misspelt_field() -> None:
    doc = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "x"},
        "spec": {"selectr": {"a": "b"}},
    }
    assert _round_trip(doc) == ["/spec/selectr"]


def test_postgres_statefulset_and_service_exist(objects: list[dict[str, Any]]) -> None:
    sts = _find(objects, "StatefulSet", "postgres")
    assert sts["spec"]["serviceName"] == _find(objects, "Service", "postgres")["metadata"]["name"]


def test_the_sandbox_pod_template_round_trips_with_its_security_fields() -> None:
    spec = SandboxSpec(
        name="sb-1",
        nonce="n",
        token="t",
        job_id=1,
        role="grading",
        image="task:1",
        base_commit=None,
        cpu_millis=2000,
        memory_bytes=8 * 2**30,
        workspace_bytes=2**30,
        egress="deny",
        key_hash="abc",
    )
    api = client.ApiClient()
    doc = api.sanitize_for_serialization(build_pod_manifest(spec, KubernetesConfig()))
    assert _round_trip(doc) == []
    pod = doc["spec"]
    assert pod["automountServiceAccountToken"] is False and pod["enableServiceLinks"] is False
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    for container in pod["initContainers"] + pod["containers"]:
        sc = container["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False and "NET_RAW" in sc["capabilities"]["drop"]
        assert container["resources"]["requests"] == container["resources"]["limits"]
    assert pod["topologySpreadConstraints"][0]["whenUnsatisfiable"] == "ScheduleAnyway"
