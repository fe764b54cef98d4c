"""A watch the server ends, cleanly or by a broken connection, as a real API server can.

Kubernetes API Concepts -- Efficient detection of changes,
https://kubernetes.io/docs/reference/using-api/api-concepts/#efficient-detection-of-changes:
a watch can end at any time (timeout, restart, a dropped connection); the client resumes
from the last ``resourceVersion`` it saw, and only a 410 Gone forces a new list.
"""

from __future__ import annotations

import pytest
import urllib3
from kubernetes import client, watch

from standin import StandinCluster
from standin.tests.conftest import NS, pod


def test_a_dropped_watch_breaks_after_its_initial_events_and_resumes_from_its_version(
    cluster: StandinCluster, core: client.CoreV1Api
) -> None:
    created = core.create_namespaced_pod(NS, pod("a"))
    plan = cluster.plans.add("watch", "drop")
    seen = []
    with pytest.raises(urllib3.exceptions.HTTPError):
        for event in watch.Watch().stream(core.list_namespaced_pod, NS, timeout_seconds=30):
            seen.append(event["object"].metadata.name)
    assert seen == ["a"] and plan.fired == 1
    version = created.metadata.resource_version
    core.create_namespaced_pod(NS, pod("b"))
    stream = watch.Watch().stream(
        core.list_namespaced_pod, NS, resource_version=version, timeout_seconds=30
    )
    resumed = []
    for event in stream:
        resumed.append((event["type"], event["object"].metadata.name))
        if resumed[-1] == ("ADDED", "b"):
            break
    assert ("ADDED", "a") not in resumed  # resumed from the version: no initial ADDED again
