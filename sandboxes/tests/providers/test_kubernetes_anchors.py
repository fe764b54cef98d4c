"""The provider's owner references satisfy the garbage collector's rules (real HTTP).

The stand-in's collector resolves an owner reference as Kubernetes' does ("Garbage
Collection -- Owners and dependents", https://kubernetes.io/docs/concepts/architecture/
garbage-collection/#owners-dependents): by kind, name and uid, in the dependent's namespace
only. So the provider may name the trainer pod only when that very pod (name AND uid) is in
the sandbox namespace; otherwise it names the job's anchor ConfigMap.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from sandboxes.providers.base import OwnerRef
from sandboxes.providers.kubernetes import KubernetesProvider
from sandboxes.tests.providers.conftest import NS, spec
from standin import StandinCluster

MakeCluster = Callable[..., StandinCluster]
MakeProvider = Callable[..., KubernetesProvider]


def _trainer(cluster: StandinCluster, namespace: str, name: str = "trainer-0") -> OwnerRef:
    body = {"metadata": {"name": name}, "spec": {"containers": [{"name": "t", "image": "x"}]}}
    uid = cluster.put_pod(namespace, body)["metadata"]["uid"]
    return OwnerRef(kind="Pod", name=name, uid=uid)


@pytest.mark.asyncio
async def test_a_trainer_in_the_sandbox_namespace_owns_the_pods_and_they_survive_the_gc(
    make_cluster: MakeCluster, make_provider: MakeProvider
) -> None:
    cluster = make_cluster(nodes=1, mode="manual")
    provider = make_provider(cluster)
    trainer = _trainer(cluster, NS)
    owner = await provider.owner_for(7, trainer)
    assert owner == OwnerRef(kind="Pod", name="trainer-0", uid=trainer.uid, api_version="v1")
    await provider.create(spec("sb-1", owner=owner))
    cluster.run_until_idle()
    (ref,) = cluster.pod(NS, "sb-1")["metadata"]["ownerReferences"]  # type: ignore[index]
    assert (ref["kind"], ref["name"], ref["uid"]) == ("Pod", "trainer-0", trainer.uid)
    assert cluster.configmaps(NS) == []  # no anchor was needed


@pytest.mark.asyncio
@pytest.mark.parametrize("where", ["other-namespace", "wrong-uid"])
async def test_a_trainer_outside_the_sandbox_namespace_gets_the_job_anchor_instead(
    make_cluster: MakeCluster, make_provider: MakeProvider, where: str
) -> None:
    """A trainer in another namespace -- even one whose same-named twin lives in the sandbox
    namespace with another uid -- would be an absent owner: the pods would be collected."""
    cluster = make_cluster(nodes=1, mode="manual")
    provider = make_provider(cluster)
    trainer = _trainer(cluster, "trainers")
    if where == "wrong-uid":
        _trainer(cluster, NS)  # same name, another uid, in the sandbox namespace
    owner = await provider.owner_for(7, trainer)
    assert owner is not None and (owner.kind, owner.name) == ("ConfigMap", "sandman-job-7")
    await provider.create(spec("sb-1", owner=owner))
    cluster.run_until_idle()
    assert cluster.pod(NS, "sb-1") is not None  # its owner resolves: the GC keeps it
    gc = [e for e in cluster.events() if e["reason"] == "GarbageCollected"]
    assert gc == []
    await provider.delete_anchor(7)
    cluster.run_until_idle()
    assert cluster.pod(NS, "sb-1") is None
