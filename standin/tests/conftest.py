"""Fixtures for the stand-in's own tests: clusters that are always stopped, real clients."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client

from standin import StandinCluster

NS = "sbx"


@pytest.fixture
def make_cluster() -> Iterator[Callable[..., StandinCluster]]:
    started: list[StandinCluster] = []

    def make(**kwargs: Any) -> StandinCluster:
        cluster = StandinCluster(**kwargs)
        cluster.start()
        started.append(cluster)
        return cluster

    try:
        yield make
    finally:
        for cluster in started:
            cluster.stop()


@pytest.fixture
def cluster(make_cluster: Callable[..., StandinCluster]) -> StandinCluster:
    return make_cluster(nodes=3)


def core_for(cluster: StandinCluster) -> client.CoreV1Api:
    configuration = client.Configuration()
    configuration.host = cluster.url
    configuration.retries = False
    return client.CoreV1Api(client.ApiClient(configuration))


@pytest.fixture
def core(cluster: StandinCluster) -> Iterator[client.CoreV1Api]:
    api = core_for(cluster)
    try:
        yield api
    finally:
        api.api_client.close()


def pod(
    name: str,
    *,
    labels: dict[str, str] | None = None,
    image: str = "task/img:1",
    cpu: str = "500m",
    memory: str = "1Gi",
    annotations: dict[str, str] | None = None,
    spread: dict[str, Any] | None = None,
    owner: tuple[str, str, str] | None = None,
) -> dict[str, Any]:
    """A pod body as the client would send it (requests == limits)."""
    res = {"cpu": cpu, "memory": memory}
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}, "annotations": annotations or {}},
        "spec": {
            "containers": [
                {"name": "sandbox", "image": image, "resources": {"requests": res, "limits": res}}
            ]
        },
    }
    if spread is not None:
        body["spec"]["topologySpreadConstraints"] = [spread]
    if owner is not None:
        kind, owner_name, uid = owner
        body["metadata"]["ownerReferences"] = [
            {"apiVersion": "v1", "kind": kind, "name": owner_name, "uid": uid}
        ]
    return body
