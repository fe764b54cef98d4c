"""Kubernetes backend: the create's request body -- the pod manifest as plain JSON, built
once per template -- and the create request sent with it.

``manifest.build_pod_manifest`` builds client models; turning them into the request's JSON
(the client's ``sanitize_for_serialization``) cost ~1.2 ms a pod and building them ~0.4 ms,
more than the rest of a create's CPU in the provider. Pods of one job and key differ only in
their name, nonce and token, so :class:`PodBodies` builds the manifest ONCE per template --
the spec with those three replaced by placeholders of the same length -- keeps its JSON
text, and gives each pod that text with the placeholders replaced.

Rules a reader must not break:
* A template is trusted only after the body it gives for its FIRST real spec equals that
  spec's own build (the slow path, compared as JSON). If they differ (the manifest derives
  something from the name other than the name itself, or a placeholder also appears
  elsewhere), that template is never used: every pod of it is built directly.
* The manifest stays ``build_pod_manifest``'s, field for field: this module only caches it.
* :func:`post_pod` sends the body with the client's own request machinery
  (``ApiClient.param_serialize`` + ``call_api``, what ``create_namespaced_pod`` does
  after validating its model argument) and answers the raw response; a non-2xx raises
  ``ApiException`` as the typed call does with ``_preload_content=False``.
"""

from __future__ import annotations

import dataclasses
import json
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sandboxes.providers.base import SandboxSpec
from sandboxes.providers.kubernetes.config import KubernetesConfig
from sandboxes.providers.kubernetes.manifest import build_pod_manifest

Body = dict[str, Any]
_TEMPLATES_KEPT = 256


def _placeholder(tag: str, length: int) -> str:
    """``length`` characters no manifest field holds by itself (letters only: a label
    value's strip of ``-_.`` leaves it alone)."""
    return (f"zq{tag}" * (length // (len(tag) + 2) + 1))[:length]


@dataclasses.dataclass
class _Template:
    text: str
    name: str
    nonce: str
    token: str
    trusted: bool | None = None  # None: not checked against a real spec yet


class PodBodies:
    """The JSON body of each pod's create, from a cached template per (spec minus name,
    nonce and token)."""

    def __init__(
        self,
        api_client: client.ApiClient,
        config: KubernetesConfig,
        build: Callable[[SandboxSpec, KubernetesConfig], Any] = build_pod_manifest,
    ) -> None:
        self._api, self._config, self._build = api_client, config, build
        self._templates: OrderedDict[SandboxSpec, _Template] = OrderedDict()
        self.direct_builds = 0  # bodies built the slow way (first pods, untrusted templates)

    def _direct(self, spec: SandboxSpec) -> Body:
        self.direct_builds += 1
        body: Body = self._api.sanitize_for_serialization(self._build(spec, self._config))
        return body

    def body(self, spec: SandboxSpec) -> Body:
        # The lengths are part of the template: a value cut to fit (a label's 63) cuts the
        # placeholder of the same length at the same place.
        key = dataclasses.replace(
            spec, name=str(len(spec.name)), nonce=str(len(spec.nonce)), token=str(len(spec.token))
        )
        template = self._templates.get(key)
        if template is None:
            name = _placeholder("n", len(spec.name))
            nonce = _placeholder("o", len(spec.nonce))
            token = _placeholder("t", len(spec.token))
            generic = dataclasses.replace(spec, name=name, nonce=nonce, token=token)
            text = json.dumps(self._direct(generic))
            template = _Template(text=text, name=name, nonce=nonce, token=token)
            self._templates[key] = template
            if len(self._templates) > _TEMPLATES_KEPT:
                self._templates.popitem(last=False)
        else:
            self._templates.move_to_end(key)
        if template.trusted is False:
            return self._direct(spec)
        text = template.text
        for mark, value in (
            (template.name, spec.name),
            (template.nonce, spec.nonce),
            (template.token, spec.token),
        ):
            if mark:
                text = text.replace(mark, json.dumps(value)[1:-1])
        body: Body = json.loads(text)
        if template.trusted is None:
            direct = self._direct(spec)
            template.trusted = body == direct
            return direct
        return body


def post_pod(core: client.CoreV1Api, namespace: str, body: Body, *, request_timeout: float) -> Any:
    """``POST /api/v1/namespaces/{namespace}/pods`` with a plain JSON body; the raw
    urllib3 response (read it, then ``release_conn``)."""
    api = core.api_client
    request = api.param_serialize(
        method="POST",
        resource_path="/api/v1/namespaces/{namespace}/pods",
        path_params={"namespace": namespace},
        header_params={"Accept": "application/json", "Content-Type": "application/json"},
        body=body,
        auth_settings=["BearerToken"],
    )
    resp = api.call_api(*request, _request_timeout=request_timeout)
    if not 200 <= resp.status <= 299:
        resp.read()
        raise ApiException.from_response(http_resp=resp, body=None, data=None)
    return resp.response
