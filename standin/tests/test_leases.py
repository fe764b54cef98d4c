"""The stand-in serves coordination.k8s.io/v1 Leases as the API server does.

* "Leases", https://kubernetes.io/docs/concepts/architecture/leases/ -- leader election
  holds a Lease: ``holderIdentity``, ``leaseDurationSeconds``, ``acquireTime``,
  ``renewTime``.
* "Lease v1", https://kubernetes.io/docs/reference/kubernetes-api/cluster-resources/lease-v1/
  -- create, read, replace, delete under ``/apis/coordination.k8s.io/v1``.
* "Resource versions" / "Conflicts",
  https://kubernetes.io/docs/reference/using-api/api-concepts/#resource-versions -- an
  update carrying a resourceVersion that is no longer current is refused with 409
  Conflict; a Lease's update must carry one (no unconditional update: 422).
"""

from __future__ import annotations

import datetime as dt

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from standin import StandinCluster
from standin.tests.conftest import NS


def coordination(cluster: StandinCluster) -> client.CoordinationV1Api:
    configuration = client.Configuration()
    configuration.host = cluster.url
    return client.CoordinationV1Api(client.ApiClient(configuration))


def lease(name: str, holder: str, *, duration: int = 15) -> client.V1Lease:
    now = dt.datetime.now(dt.UTC)
    return client.V1Lease(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1LeaseSpec(
            holder_identity=holder,
            lease_duration_seconds=duration,
            acquire_time=now,
            renew_time=now,
        ),
    )


def test_a_lease_is_created_read_and_replaced_with_a_new_resource_version(cluster):
    api = coordination(cluster)
    created = api.create_namespaced_lease(NS, lease("ctl", "a"))
    assert created.kind == "Lease" and created.api_version == "coordination.k8s.io/v1"
    read = api.read_namespaced_lease("ctl", NS)
    assert read.spec.holder_identity == "a" and read.spec.lease_duration_seconds == 15
    assert read.metadata.resource_version == created.metadata.resource_version
    read.spec.holder_identity = "b"
    replaced = api.replace_namespaced_lease("ctl", NS, read)
    assert replaced.spec.holder_identity == "b"
    assert replaced.metadata.resource_version != read.metadata.resource_version
    assert replaced.metadata.uid == created.metadata.uid
    assert cluster.lease(NS, "ctl")["spec"]["holderIdentity"] == "b"
    # renewTime is a MicroTime: stored with its microseconds, in UTC.
    assert cluster.lease(NS, "ctl")["spec"]["renewTime"].endswith("Z")


def test_a_replace_from_a_stale_read_is_a_409_conflict_and_changes_nothing(cluster):
    api = coordination(cluster)
    api.create_namespaced_lease(NS, lease("ctl", "a"))
    first = api.read_namespaced_lease("ctl", NS)
    second = api.read_namespaced_lease("ctl", NS)
    first.spec.holder_identity = "first"
    api.replace_namespaced_lease("ctl", NS, first)
    second.spec.holder_identity = "second"
    with pytest.raises(ApiException) as refused:
        api.replace_namespaced_lease("ctl", NS, second)
    assert refused.value.status == 409 and '"reason": "Conflict"' in refused.value.body
    assert cluster.lease(NS, "ctl")["spec"]["holderIdentity"] == "first"


def test_a_second_create_is_409_already_exists(cluster):
    api = coordination(cluster)
    api.create_namespaced_lease(NS, lease("ctl", "a"))
    with pytest.raises(ApiException) as refused:
        api.create_namespaced_lease(NS, lease("ctl", "b"))
    assert refused.value.status == 409 and "AlreadyExists" in refused.value.body
    assert cluster.lease(NS, "ctl")["spec"]["holderIdentity"] == "a"


def test_bad_writes_are_refused_as_the_api_server_refuses_them(cluster):
    api = coordination(cluster)
    with pytest.raises(ApiException) as missing:
        api.read_namespaced_lease("nope", NS)
    assert missing.value.status == 404
    with pytest.raises(ApiException) as no_create_on_update:
        api.replace_namespaced_lease("nope", NS, lease("nope", "a"))
    assert no_create_on_update.value.status == 404
    with pytest.raises(ApiException) as bad_duration:
        api.create_namespaced_lease(NS, lease("ctl", "a", duration=0))
    assert bad_duration.value.status == 422 and "leaseDurationSeconds" in bad_duration.value.body
    api.create_namespaced_lease(NS, lease("ctl", "a"))
    unconditional = lease("ctl", "b")  # no resourceVersion
    with pytest.raises(ApiException) as no_version:
        api.replace_namespaced_lease("ctl", NS, unconditional)
    assert no_version.value.status == 422 and "resourceVersion" in no_version.value.body
    other = api.read_namespaced_lease("ctl", NS)
    other.metadata.name = "other"
    with pytest.raises(ApiException) as renamed:
        api.replace_namespaced_lease("ctl", NS, other)
    assert renamed.value.status == 400
    assert cluster.lease(NS, "ctl")["spec"]["holderIdentity"] == "a"
    api.delete_namespaced_lease("ctl", NS)
    assert cluster.lease(NS, "ctl") is None


def test_every_stored_version_of_a_lease_is_kept_in_write_order_with_the_open_watches(cluster):
    api = coordination(cluster)
    api.create_namespaced_lease(NS, lease("ctl", "a"))
    read = api.read_namespaced_lease("ctl", NS)
    read.spec.holder_identity = ""  # a released Lease (client-go's release())
    read.spec.lease_duration_seconds = 1
    api.replace_namespaced_lease("ctl", NS, read)
    writes = cluster.lease_writes(NS, "ctl")
    assert [w["lease"]["spec"]["holderIdentity"] for w in writes] == ["a", ""]
    versions = [int(w["lease"]["metadata"]["resourceVersion"]) for w in writes]
    assert versions == sorted(versions) and len(set(versions)) == 2
    assert [w["open_watches"] for w in writes] == [0, 0]
    assert cluster.lease_writes(NS, "missing") == []
