"""A create the API server answered 504 (or whose connection dropped) can still land later.

kube-apiserver answers 504 ``Timeout`` when a request exceeds its ``--request-timeout``
(default 1m0s; "kube-apiserver", https://kubernetes.io/docs/reference/command-line-tools-
reference/kube-apiserver/), but the write it handed to storage is not withdrawn: the API
conventions' "HTTP Status codes" (https://github.com/kubernetes/community/blob/master/
contributors/devel/sig-architecture/api-conventions.md#http-status-codes) say only that the
action could not be completed in a reasonable time. The stand-in's ``504_store_later`` /
``reset_store_later`` plans answer with nothing stored, then store the pod ``delay_s``
simulated seconds later (manual clock here).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import urllib3
from kubernetes import client

from standin import StandinCluster
from standin.tests.conftest import NS, core_for, pod


@pytest.mark.parametrize("action", ["504_store_later", "reset_store_later"])
def test_a_timed_out_create_is_stored_after_its_delay(
    make_cluster: Callable[..., StandinCluster], action: str
) -> None:
    cluster = make_cluster(nodes=1, mode="manual")
    core = core_for(cluster)
    plan = cluster.plans.add("create", action, name_prefix="late", delay_s=4.0)
    raised: type[Exception] = (
        client.ApiException if action.startswith("504") else (urllib3.exceptions.ProtocolError)
    )
    with pytest.raises(raised) as caught:
        core.create_namespaced_pod(NS, pod("late", annotations={"n": "1"}))
    if action.startswith("504"):
        assert caught.value.status == 504  # type: ignore[attr-defined]
    with pytest.raises(client.ApiException) as missing:
        core.read_namespaced_pod("late", NS)  # the read-back right after: not there yet
    assert missing.value.status == 404
    cluster.advance(3.9)
    assert cluster.pod(NS, "late") is None
    cluster.advance(0.2)
    landed = core.read_namespaced_pod("late", NS)
    assert landed.metadata.annotations["n"] == "1" and landed.metadata.uid
    assert plan.fired == 1


def test_a_late_write_whose_name_was_taken_meanwhile_fails_quietly(
    make_cluster: Callable[..., StandinCluster],
) -> None:
    cluster = make_cluster(nodes=1, mode="manual")
    core = core_for(cluster)
    cluster.plans.add("create", "504_store_later", name_prefix="late", delay_s=2.0)
    with pytest.raises(client.ApiException):
        core.create_namespaced_pod(NS, pod("late", annotations={"who": "first"}))
    core.create_namespaced_pod(NS, pod("late", annotations={"who": "second"}))
    cluster.advance(5)
    p = cluster.pod(NS, "late")
    assert p is not None and p["metadata"]["annotations"]["who"] == "second"
