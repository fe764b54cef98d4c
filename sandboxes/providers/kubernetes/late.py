"""Kubernetes backend: creates that may still land after their read-back found nothing.

kube-apiserver answers 504 once a request outlives its ``--request-timeout`` (default 60 s)
-- or the connection drops -- but the write it handed to storage may still be committed.
The creator's read-back can then find nothing although the pod appears a moment later. So
such a create is *expected* here, by name and nonce, and the informer's events (it sees
every pod with Sandman's labels) are checked against it: a pod of that name carrying that
nonce is handed to ``on_landed`` to be deleted.

Rules a reader must not break:
* Only a pod with the expected NONCE is ours; a pod that took the name with another nonce
  is another workload's and is never reported (paper Appendix F).
* An expectation ends when its pod lands or when its name is proven absent past the
  server's timeout: the create was sent at ``since``; the server cannot commit it after
  ``since + server_request_timeout_s``, and the informer, which delivers changes in order,
  has shown everything committed by then once ``request_timeout_s`` more has passed.
* Runs on the provider's loop (the informer's callbacks); ``clock`` is time.monotonic.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from sandboxes import labels as L
from sandboxes.providers.kubernetes.config import KubernetesConfig
from sandboxes.providers.kubernetes.informer import Pod, pod_meta


class LateCreates:
    """Expected late-landing creates, matched by nonce against the informer's pods."""

    def __init__(
        self,
        config: KubernetesConfig,
        *,
        on_landed: Callable[[str, str, str], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._margin = config.server_request_timeout_s + config.request_timeout_s
        self._on_landed, self._clock = on_landed, clock
        self._expected: dict[str, tuple[str, float]] = {}  # name -> (nonce, watch until)
        self._present: dict[str, Pod] = {}  # the informer's pods: one may have come first

    def expect(self, name: str, nonce: str, since: float) -> None:
        """Watch for ``name`` with ``nonce``: a create sent at ``since`` found absent."""
        self._expected[name] = (nonce, since + self._margin)
        pod = self._present.get(name)
        if pod is not None:  # it landed between the read-back and now
            self._check(pod)

    def expected(self) -> list[str]:
        return sorted(self._expected)

    # --- informer callbacks -------------------------------------------------------------------
    def on_sync(self, pods: list[Pod], started: float, version: str) -> None:
        self._present = {pod_meta(p).get("name", ""): p for p in pods}
        for pod in pods:
            self._check(pod)
        self._expire()

    def on_event(self, kind: str, pod: Pod) -> None:
        name = pod_meta(pod).get("name", "")
        if kind == "DELETED":
            self._present.pop(name, None)
        elif kind in ("ADDED", "MODIFIED"):
            self._present[name] = pod
            self._check(pod)
        self._expire()

    def _check(self, pod: Pod) -> None:
        meta = pod_meta(pod)
        name = meta.get("name", "")
        wanted = self._expected.get(name)
        if wanted is None:
            return
        nonce = (meta.get("annotations") or {}).get(L.NONCE_ANNOTATION, "")
        if nonce == wanted[0]:
            del self._expected[name]
            self._on_landed(name, meta.get("uid", ""), nonce)

    def _expire(self) -> None:
        if not self._expected:  # the usual case: nothing found absent (every pod event)
            return
        now = self._clock()
        for name in [n for n, (_, until) in self._expected.items() if until < now]:
            del self._expected[name]  # proven absent: nothing can land any more
