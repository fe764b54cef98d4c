"""The stand-in's garbage collector resolves owner references as the real collector does.

Imitates "Garbage Collection -- Owners and dependents",
https://kubernetes.io/docs/concepts/architecture/garbage-collection/#owners-dependents
("A namespaced owner must exist in the same namespace as the dependent. If it does not,
the owner reference is treated as absent, and the dependent is subject to deletion once
all owners are verified absent.") and "Owners and Dependents",
https://kubernetes.io/docs/concepts/overview/working-with-objects/owners-dependents/
("A valid owner reference consists of the object name and a UID within the same namespace
as the dependent object."): a reference matches by kind (the resource looked up), name and
uid, in the dependent's namespace only.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from kubernetes import client

from standin import StandinCluster
from standin.tests.conftest import NS, core_for, pod


def _anchor(core: client.CoreV1Api, namespace: str = NS, name: str = "anchor") -> str:
    body = client.V1ConfigMap(metadata=client.V1ObjectMeta(name=name))
    return str(core.create_namespaced_config_map(namespace, body).metadata.uid)


@pytest.mark.parametrize(
    ("kind", "name"),
    [("Pod", "anchor"), ("ConfigMap", "someone-else")],
    ids=["wrong-kind", "wrong-name"],
)
def test_an_owner_reference_with_the_right_uid_but_a_wrong_kind_or_name_is_absent(
    make_cluster: Callable[..., StandinCluster], kind: str, name: str
) -> None:
    cluster = make_cluster(nodes=1, mode="manual")
    core = core_for(cluster)
    uid = _anchor(core)
    core.create_namespaced_config_map(
        NS, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="someone-else"))
    )
    core.create_namespaced_pod(NS, pod("mismatched", owner=(kind, name, uid)))
    core.create_namespaced_pod(NS, pod("matched", owner=("ConfigMap", "anchor", uid)))
    cluster.run_until_idle()
    assert [p["metadata"]["name"] for p in cluster.pods(NS)] == ["matched"]
    gc = [
        e["involvedObject"]["name"] for e in cluster.events() if e["reason"] == "GarbageCollected"
    ]
    assert gc == ["mismatched"]


def test_an_owner_in_another_namespace_is_absent_and_the_dependent_is_collected(
    make_cluster: Callable[..., StandinCluster],
) -> None:
    cluster = make_cluster(nodes=1, mode="manual")
    core = core_for(cluster)
    elsewhere = _anchor(core, namespace="trainers")
    here = _anchor(core)
    core.create_namespaced_pod(NS, pod("cross", owner=("ConfigMap", "anchor", elsewhere)))
    core.create_namespaced_pod(NS, pod("local", owner=("ConfigMap", "anchor", here)))
    cluster.run_until_idle()
    assert [p["metadata"]["name"] for p in cluster.pods(NS)] == ["local"]
    assert cluster.configmaps("trainers")  # the other namespace's object itself stays


def test_an_owner_that_turns_out_to_be_in_another_namespace_never_protects_on_deletion(
    make_cluster: Callable[..., StandinCluster],
) -> None:
    """Deleting the real owner collects the dependent even if a same-named object with the
    reference's uid lives elsewhere: lookups never leave the dependent's namespace."""
    cluster = make_cluster(nodes=1, mode="manual")
    core = core_for(cluster)
    uid = _anchor(core)
    core.create_namespaced_pod(NS, pod("owned", owner=("ConfigMap", "anchor", uid)))
    cluster.run_until_idle()
    core.create_namespaced_config_map(
        "trainers", client.V1ConfigMap(metadata=client.V1ObjectMeta(name="anchor"))
    )
    core.delete_namespaced_config_map("anchor", NS)
    cluster.run_until_idle()
    assert cluster.pods(NS) == []


def test_a_kind_the_stand_in_cannot_resolve_keeps_its_dependent(
    make_cluster: Callable[..., StandinCluster],
) -> None:
    cluster = make_cluster(nodes=1, mode="manual")
    core = core_for(cluster)
    core.create_namespaced_pod(NS, pod("job-pod", owner=("Job", "train", "uid-of-a-job")))
    cluster.run_until_idle()
    assert [p["metadata"]["name"] for p in cluster.pods(NS)] == ["job-pod"]
