"""Kubernetes backend: which of Sandman's pods are Terminating, and which are gone.

A DELETE that answers 2xx only starts a pod's termination: the pod stays, with
``metadata.deletionTimestamp`` set, until its kubelet has stopped it (longer on a lost
node, or with finalizers), and it is gone only when the API server removes it -- a DELETED
watch event, a relist without it, or a 404 read. :class:`GoneTracker` follows that from
the informer's callbacks so the deleter confirms a delete only when the pod is gone and
never DELETEs a pod that is already Terminating.

Rules a reader must not break:
* Every method runs on the provider's loop (the informer posts its callbacks there); the
  cache has no lock.
* "Gone" is told per uid: a name may already hold a new pod. ``on_gone(name, uid, nonce)``
  is called once per pod that left the cache or was DELETED; recently gone uids are kept
  (bounded) so a caller that asks after the event still learns it at once.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from sandboxes import labels as L
from sandboxes.providers.kubernetes.informer import Pod, pod_meta

_GONE_KEPT = 10_000


class GoneTracker:
    """Terminating and gone pods from the informer's list+watch."""

    def __init__(self, on_gone: Callable[[str, str, str], None]) -> None:
        self._on_gone = on_gone
        self._pods: dict[str, tuple[str, bool, str]] = {}  # name -> (uid, terminating, nonce)
        self._gone: OrderedDict[str, None] = OrderedDict()

    @staticmethod
    def _facts(pod: Pod) -> tuple[str, str, bool, str]:
        meta = pod_meta(pod)
        nonce = (meta.get("annotations") or {}).get(L.NONCE_ANNOTATION, "")
        return meta.get("name", ""), meta.get("uid", ""), bool(meta.get("deletionTimestamp")), nonce

    # --- informer callbacks -------------------------------------------------------------------
    def on_sync(self, pods: list[Pod], started: float, version: str) -> None:
        fresh: dict[str, tuple[str, bool, str]] = {}
        for pod in pods:
            name, uid, terminating, nonce = self._facts(pod)
            fresh[name] = (uid, terminating, nonce)
        for name, (uid, _, nonce) in self._pods.items():
            if fresh.get(name, ("",))[0] != uid:  # left while we were not watching
                self._mark_gone(name, uid, nonce)
        self._pods = fresh

    def on_event(self, kind: str, pod: Pod) -> None:
        name, uid, terminating, nonce = self._facts(pod)
        if kind == "DELETED":
            if self._pods.get(name, ("",))[0] == uid:
                del self._pods[name]
            self._mark_gone(name, uid, nonce)
            return
        previous = self._pods.get(name)
        if previous is not None and previous[0] != uid:
            self._mark_gone(name, previous[0], previous[2])  # replaced: the old one is gone
        self._pods[name] = (uid, terminating, nonce)

    def _mark_gone(self, name: str, uid: str, nonce: str) -> None:
        if uid in self._gone:
            return
        self._gone[uid] = None
        while len(self._gone) > _GONE_KEPT:
            self._gone.popitem(last=False)
        self._on_gone(name, uid, nonce)

    # --- questions ----------------------------------------------------------------------------
    def terminating(self, name: str, uid: str) -> bool:
        """Is ``name`` (as ``uid``; any uid when empty) known to be Terminating?"""
        known = self._pods.get(name)
        return known is not None and known[1] and uid in ("", known[0])

    def was_gone(self, uid: str) -> bool:
        return bool(uid) and uid in self._gone
