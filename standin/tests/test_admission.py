"""The stand-in refuses pod creates as kube-apiserver does, before anything is stored.

Each test names the Kubernetes documentation whose behaviour it imitates; all go over real
HTTP with the official client.
"""

from __future__ import annotations

import json
import urllib.request

import pytest
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from standin import StandinCluster
from standin.admission import PodQuota
from standin.tests.conftest import NS, pod

JSON_HEADERS = {"Content-Type": "application/json"}


def _status(exc: ApiException) -> dict[str, object]:
    body = json.loads(exc.body)
    assert body["kind"] == "Status" and body["code"] == exc.status
    return body


@pytest.mark.parametrize("verb", ["create", "list", "watch"])
def test_a_shed_request_is_a_429_with_retry_after_and_stores_nothing(
    cluster: StandinCluster, core: client.CoreV1Api, verb: str
) -> None:
    """API Priority and Fairness, https://kubernetes.io/docs/concepts/cluster-administration/flow-control/
    -- a request APF rejects is answered 429 with a ``Retry-After`` header, for any verb."""
    plan = cluster.plans.add(verb, "429", retry_after_s=3)
    with pytest.raises(ApiException) as caught:
        if verb == "create":
            core.create_namespaced_pod(NS, pod("shed"))
        elif verb == "list":
            core.list_namespaced_pod(NS)
        else:
            next(iter(watch.Watch().stream(core.list_namespaced_pod, NS, timeout_seconds=5)))
    assert caught.value.status == 429
    assert caught.value.headers["Retry-After"] == "3"
    body = _status(caught.value)
    assert body["reason"] == "TooManyRequests"
    assert body["details"] == {"retryAfterSeconds": 3}
    assert plan.fired == 1 and cluster.pods(NS) == []
    core.create_namespaced_pod(NS, pod("after"))  # one-shot: the next request goes through


@pytest.mark.parametrize(
    ("body", "field", "reason"),
    [
        (pod("Bad_Name"), "metadata.name", "FieldValueInvalid"),
        (pod("ok", labels={"team": "not ok!"}), "metadata.labels", "FieldValueInvalid"),
        (pod("ok", image=""), "spec.containers[0].image", "FieldValueRequired"),
        (pod("ok", image=" task/img:1"), "spec.containers[0].image", "FieldValueInvalid"),
        ({"metadata": {"name": "ok"}, "spec": {"containers": []}}, "spec.containers", None),
    ],
)
def test_an_invalid_pod_is_a_422_naming_each_field(
    cluster: StandinCluster,
    core: client.CoreV1Api,
    body: dict[str, object],
    field: str,
    reason: str | None,
) -> None:
    """Object Names and IDs, https://kubernetes.io/docs/concepts/overview/working-with-objects/names/
    -- pod names are DNS-1123 subdomains; a refused object is 422 Invalid with
    ``details.causes`` naming each field, and ``Pod "<name>" is invalid: <field>: ...``."""
    with pytest.raises(ApiException) as caught:
        core.create_namespaced_pod(NS, body)
    assert caught.value.status == 422
    status = _status(caught.value)
    assert status["reason"] == "Invalid"
    name = body["metadata"]["name"]  # type: ignore[index]
    assert str(status["message"]).startswith(f'Pod "{name}" is invalid: {field}: ')
    (cause,) = status["details"]["causes"]  # type: ignore[index]
    assert cause["field"] == field
    assert cause["reason"] == (reason or "FieldValueRequired")
    assert cluster.pods(NS) == [] and cluster.store.rv == 1


def test_dry_run_all_validates_and_answers_without_storing(
    cluster: StandinCluster, core: client.CoreV1Api
) -> None:
    """Kubernetes API Concepts -- Dry-run,
    https://kubernetes.io/docs/reference/using-api/api-concepts/#dry-run -- ``dryRun=All``
    runs validation and admission, answers the object, and persists nothing."""
    answered = core.create_namespaced_pod(NS, pod("dry"), dry_run="All")
    assert answered.metadata.name == "dry" and answered.metadata.uid
    assert not answered.metadata.resource_version
    assert cluster.pods(NS) == [] and cluster.request_counts()[("create", "pods")] == 1
    with pytest.raises(ApiException) as caught:
        core.create_namespaced_pod(NS, pod("dry", image=""), dry_run="All")
    assert caught.value.status == 422


def test_a_resource_quota_refuses_with_the_exceeded_quota_message(
    cluster: StandinCluster, core: client.CoreV1Api
) -> None:
    """Resource Quotas, https://kubernetes.io/docs/concepts/policy/resource-quotas/ -- a
    create over a hard limit is 403 Forbidden: ``pods "x" is forbidden: exceeded quota:
    <quota>, requested: ..., used: ..., limited: ...``; nothing is stored."""
    cluster.api.quotas[NS] = PodQuota("sandbox-quota", pods=2, cpu_millis=1500)
    core.create_namespaced_pod(NS, pod("a"))
    with pytest.raises(ApiException) as caught:
        core.create_namespaced_pod(NS, pod("big", cpu="1500m", memory="1Gi"))
    assert caught.value.status == 403
    assert _status(caught.value)["message"] == (
        'pods "big" is forbidden: exceeded quota: sandbox-quota, requested: '
        "requests.cpu=1500m, used: requests.cpu=500m, limited: requests.cpu=1500m"
    )
    core.create_namespaced_pod(NS, pod("b"))
    with pytest.raises(ApiException) as caught:
        core.create_namespaced_pod(NS, pod("c"))
    message = str(_status(caught.value)["message"])
    assert "exceeded quota: sandbox-quota, requested: pods=1" in message
    assert "used: pods=2" in message and "limited: pods=2" in message
    assert sorted(p["metadata"]["name"] for p in cluster.pods(NS)) == ["a", "b"]
    cluster.delete_pod(NS, "a")  # freed: the quota admits the next one
    core.create_namespaced_pod(NS, pod("c"))


def test_a_timed_out_admission_webhook_is_a_500_and_stores_nothing(
    cluster: StandinCluster, core: client.CoreV1Api
) -> None:
    """Dynamic Admission Control,
    https://kubernetes.io/docs/reference/access-authn-authz/extensible-admission-controllers/
    -- a webhook with ``failurePolicy: Fail`` that times out fails the request:
    ``Internal error occurred: failed calling webhook "...": ... context deadline exceeded``."""
    cluster.plans.add("create", "webhook_timeout")
    with pytest.raises(ApiException) as caught:
        core.create_namespaced_pod(NS, pod("hooked"))
    assert caught.value.status == 500
    status = _status(caught.value)
    assert status["reason"] == "InternalError"
    message = str(status["message"])
    assert message.startswith("Internal error occurred: failed calling webhook ")
    assert message.endswith("context deadline exceeded")
    assert cluster.pods(NS) == []


def _post(url: str, body: dict[str, object]) -> int:
    request = urllib.request.Request(
        url, method="POST", data=json.dumps(body).encode(), headers=JSON_HEADERS
    )
    with urllib.request.urlopen(request, timeout=10) as resp:
        return int(resp.status)


def test_control_routes_arm_a_429_plan_and_a_quota(
    cluster: StandinCluster, core: client.CoreV1Api
) -> None:
    """Out-of-process tests and benchmarks shed load and set a quota over ``/_standin/``."""
    plan = {"verb": "list", "action": "429", "retry_after_s": 2}
    assert _post(cluster.url + "/_standin/plans", plan) == 201
    with pytest.raises(ApiException) as caught:
        core.list_namespaced_pod(NS)
    assert caught.value.status == 429 and caught.value.headers["Retry-After"] == "2"
    assert _post(cluster.url + f"/_standin/quota/{NS}", {"pods": 0}) == 201
    with pytest.raises(ApiException) as caught:
        core.create_namespaced_pod(NS, pod("a"))
    assert caught.value.status == 403 and "exceeded quota" in caught.value.body
    request = urllib.request.Request(cluster.url + f"/_standin/quota/{NS}", method="DELETE")
    with urllib.request.urlopen(request, timeout=10) as resp:
        assert resp.status == 200
    core.create_namespaced_pod(NS, pod("a"))
