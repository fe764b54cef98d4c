"""The stand-in stores Secrets as the API server does and mounts them as a kubelet does.

* "Secrets", https://kubernetes.io/docs/concepts/configuration/secret/ -- ``data`` is
  base64; ``stringData`` is write-only, encoded into ``data``; the type defaults to Opaque.
* "Garbage Collection" / "Owners and dependents",
  https://kubernetes.io/docs/concepts/architecture/garbage-collection/ -- a Secret owned by
  a ConfigMap goes when its owner goes.
* "Distribute Credentials Securely Using Secrets" / "Set POSIX permissions for Secret
  keys", https://kubernetes.io/docs/tasks/inject-data-application/distribute-credentials-secure/
  -- a secret volume holds one file per key, with ``defaultMode`` (default 0644).
"""

from __future__ import annotations

import base64
import stat
from collections.abc import Callable
from pathlib import Path

import pytest
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from standin import StandinCluster
from standin.containers import materialise_volumes
from standin.tests.conftest import NS, core_for, pod


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def test_a_secret_is_stored_with_string_data_folded_into_data(core: client.CoreV1Api) -> None:
    body = client.V1Secret(
        metadata=client.V1ObjectMeta(name="job-7", labels={"app": "x"}),
        data={"a": _b64("one")},
        string_data={"key": "hunter2", "a": "two"},
    )
    created = core.create_namespaced_secret(NS, body)
    assert created.type == "Opaque" and created.string_data is None
    assert created.data == {"a": _b64("two"), "key": _b64("hunter2")}
    read = core.read_namespaced_secret("job-7", NS)
    assert read.data == created.data and read.metadata.uid == created.metadata.uid
    listed = core.list_namespaced_secret(NS, label_selector="app=x")
    assert [s.metadata.name for s in listed.items] == ["job-7"]
    raw = core.read_namespaced_secret("job-7", NS, _preload_content=False).data.decode()
    assert "stringData" not in raw and "hunter2" not in raw


def test_a_secret_with_data_that_is_not_base64_is_invalid(core: client.CoreV1Api) -> None:
    with pytest.raises(ApiException) as err:
        core.create_namespaced_secret(
            NS, {"metadata": {"name": "bad"}, "data": {"key": "not base64!"}}
        )
    assert err.value.status == 422 and '"reason":"Invalid"' in err.value.body.replace(" ", "")


def test_secrets_are_watched_and_deleted(core: client.CoreV1Api) -> None:
    core.create_namespaced_secret(NS, {"metadata": {"name": "s1"}, "stringData": {"k": "v"}})
    rv = core.list_namespaced_secret(NS).metadata.resource_version
    core.delete_namespaced_secret("s1", NS)
    events = [
        (e["type"], e["object"].metadata.name)
        for e in watch.Watch().stream(
            core.list_namespaced_secret, NS, resource_version=rv, timeout_seconds=1
        )
    ]
    assert events == [("DELETED", "s1")]
    with pytest.raises(ApiException) as err:
        core.read_namespaced_secret("s1", NS)
    assert err.value.status == 404


def test_a_secret_owned_by_a_configmap_is_collected_with_it(
    cluster: StandinCluster, core: client.CoreV1Api
) -> None:
    anchor = core.create_namespaced_config_map(NS, {"metadata": {"name": "anchor"}})
    owner = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "name": "anchor",
        "uid": anchor.metadata.uid,
    }
    core.create_namespaced_secret(
        NS, {"metadata": {"name": "owned", "ownerReferences": [owner]}, "stringData": {"k": "v"}}
    )
    cluster.run_until_idle()
    assert [s["metadata"]["name"] for s in cluster.secrets(NS)] == ["owned"]
    core.delete_namespaced_config_map("anchor", NS)
    cluster.run_until_idle()
    assert cluster.secrets(NS) == []


def test_a_secret_volume_is_one_file_per_key_with_its_mode(tmp_path: Path) -> None:
    the_pod = {
        "spec": {
            "volumes": [
                {"name": "key", "secret": {"secretName": "job-7", "defaultMode": 0o400}},
                {"name": "run", "emptyDir": {"medium": "Memory"}},
            ]
        }
    }
    data = {"job-7": {"key": _b64("hunter2")}}
    made = materialise_volumes(the_pod, tmp_path, data.get)
    key_file = made["key"] / "key"
    assert key_file.read_text() == "hunter2"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o400
    assert stat.S_IMODE(made["run"].stat().st_mode) == 0o777


def test_a_pod_mounting_a_secret_reads_it_where_its_spec_mounts_it(
    make_cluster: Callable[..., StandinCluster],
) -> None:
    """The runner materialises the secret volume and the container finds the key at its
    mountPath with the volume's mode (exit 7 only when both checks pass)."""
    cluster = make_cluster(nodes=1, run_execd=True)
    core = core_for(cluster)
    try:
        core.create_namespaced_secret(
            NS, {"metadata": {"name": "job-7"}, "stringData": {"key": "hunter2"}}
        )
        body = pod("reader")
        body["spec"]["restartPolicy"] = "Never"
        body["spec"]["volumes"] = [
            {"name": "key", "secret": {"secretName": "job-7", "defaultMode": 0o400}}
        ]
        body["spec"]["containers"][0].update(
            command=[
                "sh",
                "-c",
                'test "$(cat /etc/job-key/key)" = hunter2'
                ' && test "$(stat -c %a /etc/job-key/key)" = 400 && exit 7; exit 1',
            ],
            volumeMounts=[{"name": "key", "mountPath": "/etc/job-key", "readOnly": True}],
        )
        core.create_namespaced_pod(NS, body)
        for event in watch.Watch().stream(
            core.list_namespaced_pod, NS, timeout_seconds=60, _preload_content=False
        ):
            status = event["raw_object"]["status"]
            if status.get("phase") == "Failed":
                break
        else:
            raise AssertionError("the pod never ended")
    finally:
        core.api_client.close()
    assert "exited with code 7" in status["message"]
    assert status["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 7
