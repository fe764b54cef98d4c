"""The create's body from a cached manifest template (providers/kubernetes/podbody.py):
each pod's body equals its own ``build_pod_manifest``, and a template that cannot say so is
never used."""

from __future__ import annotations

import json
from typing import Any

from kubernetes import client

from sandboxes.providers.base import SandboxSpec
from sandboxes.providers.kubernetes import KubernetesConfig
from sandboxes.providers.kubernetes.manifest import build_pod_manifest
from sandboxes.providers.kubernetes.podbody import PodBodies
from sandboxes.tests.providers.conftest import NS, spec

API = client.ApiClient()
CONFIG = KubernetesConfig(namespace=NS, topology_spread=True)


def _direct(s: SandboxSpec) -> Any:
    return API.sanitize_for_serialization(build_pod_manifest(s, CONFIG))


def test_every_pod_of_a_template_gets_exactly_its_own_manifest_and_only_the_first_is_built():
    bodies = PodBodies(API, CONFIG)
    names = [f"sm-7-{i:012x}" for i in range(5)] + ['sm-7-with"quote']
    for name in names:
        assert bodies.body(spec(name, nonce=f"n-{name}")) == _direct(spec(name, nonce=f"n-{name}"))
    # The template's own build and the first pod's check; the others are text replaced.
    assert bodies.direct_builds == 2 + 2  # the quoted name has another length: a template
    other_key = spec("sm-7-000000000009", image="task/other:2")
    assert bodies.body(other_key) == _direct(other_key)
    assert bodies.direct_builds == 6
    assert bodies.body(other_key)["spec"]["containers"][-1]["image"] == "task/other:2"


def test_a_template_whose_manifest_transforms_the_name_is_never_used():
    def upper_label(s: SandboxSpec, config: KubernetesConfig) -> Any:
        pod = build_pod_manifest(s, config)
        pod.metadata.labels["derived"] = s.name.upper()[:20]  # not the name as written
        return pod

    bodies = PodBodies(API, CONFIG, build=upper_label)
    for i in range(3):
        s = spec(f"sm-7-{i:012x}")
        body = bodies.body(s)
        assert body["metadata"]["labels"]["derived"] == s.name.upper()[:20]
        assert json.dumps(body).count(s.name) >= 1
    assert bodies.direct_builds == 1 + 3  # template, then every pod built directly


def test_a_name_of_another_length_gets_its_own_template_so_a_cut_label_stays_right():
    def cut_label(s: SandboxSpec, config: KubernetesConfig) -> Any:
        pod = build_pod_manifest(s, config)
        pod.metadata.labels["short"] = s.name[:20]  # a value cut to fit, as labels are
        return pod

    bodies = PodBodies(API, CONFIG, build=cut_label)
    for name in ("sm-7-000000000001", "sm-7-000000000002", "sm-7-" + "a" * 30):
        s = spec(name, nonce="n" * 32)
        assert bodies.body(s) == API.sanitize_for_serialization(cut_label(s, CONFIG))
    assert bodies.direct_builds == 2 + 2  # one template per name length
