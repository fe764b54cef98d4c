"""Graceful deletion as the API server and the kubelet do it: Terminating, then gone.

A DELETE of a pod does not remove it. The API server sets ``metadata.deletionTimestamp``
(when the pod will be killed) and ``deletionGracePeriodSeconds`` and answers 200 with the
pod, which stays listed and watched (MODIFIED) while the kubelet stops its containers; at
the end of the grace period the kubelet kills what is left and deletes the pod for good
(grace 0), and only then is it gone (DELETED) -- unless ``metadata.finalizers`` still name
someone, in which case it stays until a PATCH empties them. Imitates "Pod Lifecycle --
Termination of Pods", https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/
#pod-termination and "Kubernetes API Concepts", https://kubernetes.io/docs/reference/
using-api/api-concepts/ (``DeleteOptions``: ``gracePeriodSeconds``, ``preconditions``).

Rules a reader must not break:

* The grace period is the request's ``gracePeriodSeconds``, else the pod's
  ``spec.terminationGracePeriodSeconds``, else 30 s, counted on the simulation clock. A
  pod never scheduled to a node, or already Failed/Succeeded, goes at once (grace 0), as
  the API server's pod strategy does; ``gracePeriodSeconds: 0`` is a force delete.
* A second DELETE of a Terminating pod never restarts its clock; it may only shorten it.
* A pod on a partitioned node (:meth:`Terminator.partition`: its kubelet is cut off) stays
  Terminating until the node is healed or the pod is force-deleted.
* The node's capacity and the pod's address are released by the kubelet's store listener
  when the pod is really gone (DELETED), never at the DELETE.
* ConfigMaps have no kubelet: deleted at once, finalizers permitting.
"""

from __future__ import annotations

from typing import Any

from standin.sim import Simulation
from standin.status import rfc3339
from standin.store import Obj, Store, StoreError

DEFAULT_GRACE_S = 30


def _grace_of(pod: Obj, requested: int | None) -> int:
    if requested is not None:
        return max(0, int(requested))
    spec_grace = (pod.get("spec") or {}).get("terminationGracePeriodSeconds")
    return DEFAULT_GRACE_S if spec_grace is None else max(0, int(spec_grace))


class Terminator:
    """The API server's delete path for pods and ConfigMaps, and the kubelet's kill."""

    def __init__(self, *, store: Store, sim: Simulation) -> None:
        self.store, self.sim = store, sim
        self._kill_at: dict[str, float] = {}  # pod uid -> sim time its kubelet kills it
        self.partitioned: set[str] = set()  # nodes whose kubelet cannot reach the API

    # --- the API server's DELETE --------------------------------------------------------------
    def delete(
        self,
        resource: str,
        namespace: str,
        name: str,
        *,
        uid: str | None = None,
        resource_version: str | None = None,
        grace_s: int | None = None,
    ) -> Obj:
        """What a DELETE does; returns the object as it stands after it (the 200 body)."""
        obj = self.store.get(resource, namespace, name)
        if obj is None:
            raise StoreError(404, f'{resource} "{name}" not found', "NotFound")
        meta = obj["metadata"]
        if uid and meta["uid"] != uid:
            raise StoreError(
                409,
                f"Precondition failed: UID in precondition: {uid}, "
                f"UID in object meta: {meta['uid']}",
                "Conflict",
            )
        if resource_version and meta["resourceVersion"] != resource_version:
            raise StoreError(409, "Precondition failed: resourceVersion mismatch", "Conflict")
        if resource != "pods":
            return self._finish(resource, namespace, name, meta["uid"])
        grace = _grace_of(obj, grace_s)
        status = obj.get("status") or {}
        if not (obj.get("spec") or {}).get("nodeName") or status.get("phase") in (
            "Failed",
            "Succeeded",
        ):
            grace = 0  # no kubelet has to stop anything
        return self._terminate(obj, grace)

    def _terminate(self, pod: Obj, grace: int) -> Obj:
        meta = pod["metadata"]
        ns, name, uid = meta["namespace"], meta["name"], meta["uid"]
        now = self.sim.now
        current = self._kill_at.get(uid)
        if current is not None and current <= now + grace and grace > 0:
            return pod  # already Terminating at least this soon: the clock is not restarted
        if grace == 0:
            self._kill_at.pop(uid, None)
            return self._finish("pods", ns, name, uid)
        self._kill_at[uid] = now + grace
        stamp = rfc3339(self.sim.datetime(now + grace))

        def terminating(p: Obj) -> None:
            p["metadata"]["deletionTimestamp"] = stamp
            p["metadata"]["deletionGracePeriodSeconds"] = grace

        updated = self.store.update("pods", ns, name, terminating)
        node = (pod.get("spec") or {}).get("nodeName") or ""
        if node not in self.partitioned:
            self.sim.after(grace, self._kubelet_kill, ns, name, uid)
        return updated if updated is not None else pod

    # --- the kubelet --------------------------------------------------------------------------
    def _kubelet_kill(self, namespace: str, name: str, uid: str) -> None:
        """Grace over: the kubelet kills what is left and deletes the pod with grace 0."""
        due = self._kill_at.get(uid)
        pod = self.store.get("pods", namespace, name)
        if due is None or pod is None or pod["metadata"]["uid"] != uid:
            self._kill_at.pop(uid, None)
            return
        if self.sim.now + 1e-9 < due:
            return  # superseded: a shorter grace scheduled an earlier kill that ran already
        if (pod.get("spec") or {}).get("nodeName") in self.partitioned:
            return  # cut off from the API: heal() resumes it
        del self._kill_at[uid]
        self._finish("pods", namespace, name, uid)

    def partition(self, node: str) -> None:
        """Cut ``node``'s kubelet off: its Terminating pods stay until heal() or a force."""
        self.partitioned.add(node)

    def heal(self, node: str) -> int:
        """Reconnect ``node``'s kubelet: it finishes every kill that fell due meanwhile."""
        self.partitioned.discard(node)
        resumed = 0
        for pod in list(self.store.items("pods")):
            meta = pod["metadata"]
            due = self._kill_at.get(meta["uid"])
            if due is not None and (pod.get("spec") or {}).get("nodeName") == node:
                self.sim.after(
                    max(0.0, due - self.sim.now),
                    self._kubelet_kill,
                    meta["namespace"],
                    meta["name"],
                    meta["uid"],
                )
                resumed += 1
        return resumed

    # --- the end: gone, or held by finalizers -------------------------------------------------
    def _finish(self, resource: str, namespace: str, name: str, uid: str) -> Obj:
        obj = self.store.get(resource, namespace, name)
        assert obj is not None
        if not obj["metadata"].get("finalizers"):
            return self.store.delete(resource, namespace, name, uid=uid)
        stamp = obj["metadata"].get("deletionTimestamp") or rfc3339(self.sim.datetime())

        def held(o: Obj) -> None:
            o["metadata"]["deletionTimestamp"] = stamp
            o["metadata"]["deletionGracePeriodSeconds"] = 0

        updated = self.store.update(resource, namespace, name, held)
        return updated if updated is not None else obj

    def after_update(self, resource: str, namespace: str, name: str) -> Obj | None:
        """A PATCH landed: an object whose deletion only waited for its finalizers goes now.

        Returns the DELETED snapshot if it went, else None.
        """
        obj = self.store.get(resource, namespace, name)
        if obj is None:
            return None
        meta: dict[str, Any] = obj["metadata"]
        if (
            meta.get("deletionTimestamp")
            and meta.get("deletionGracePeriodSeconds") == 0
            and not meta.get("finalizers")
        ):
            self._kill_at.pop(meta["uid"], None)
            return self.store.delete(resource, namespace, name, uid=meta["uid"])
        return None
