"""The stand-in's garbage collector: dependents go when all their owners are gone.

Like Kubernetes' GC (background propagation): deleting an object schedules a check of
every object whose ``ownerReferences`` name its uid; the check deletes the dependent only
if none of its owners exists any more. With ``absent_owners`` on, an object created with
owner references that match nothing is collected too -- a real cluster does that, and it
catches a wrong uid or an owner in another namespace before production does.

Rule a reader must not break: an owner reference resolves as the real collector resolves
it -- its ``kind`` names the resource, its ``name`` is looked up in the DEPENDENT's
namespace (an ``OwnerReference`` has no namespace field), and the object found must carry
the reference's ``uid``. A right uid under a wrong kind or name, or an owner in another
namespace, is an absent owner. A kind the stand-in does not serve cannot be resolved and
keeps its dependent (the real collector retries such a reference instead of deleting).
Collected pods are deleted gracefully (``delete`` is the API server's delete path).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from standin.events import EventLog
from standin.sim import Simulation
from standin.store import Obj, Store

Dependent = tuple[str, str, str, str]  # resource, namespace, name, uid
# Owner kinds the stand-in serves, by the resource that holds them (all namespaced).
OWNER_RESOURCES = {"Pod": "pods", "ConfigMap": "configmaps"}


class GarbageCollector:
    def __init__(
        self,
        *,
        store: Store,
        sim: Simulation,
        events: EventLog,
        delay_s: float,
        absent_owners: bool,
        delete: Callable[[str, str, str, str], Any] | None = None,
    ) -> None:
        self.store, self.sim, self.events = store, sim, events
        self.delay_s, self.absent_owners = delay_s, absent_owners
        self._delete = delete or (
            lambda resource, ns, name, uid: store.delete(resource, ns, name, uid=uid)
        )
        self._dependents: dict[str, set[Dependent]] = {}
        self.collected = 0

    def on_created(self, resource: str, obj: Obj) -> None:
        meta = obj["metadata"]
        refs = meta.get("ownerReferences") or []
        dependent = (resource, meta["namespace"], meta["name"], meta["uid"])
        for ref in refs:
            self._dependents.setdefault(ref.get("uid", ""), set()).add(dependent)
        if self.absent_owners and refs and not self._any_owner(refs, meta["namespace"]):
            self.sim.after(self.delay_s, self._check, *dependent)

    def on_deleted(self, resource: str, obj: Obj) -> None:
        for dependent in self._dependents.pop(obj["metadata"]["uid"], set()):
            self.sim.after(self.delay_s, self._check, *dependent)

    def owner_present(self, ref: dict[str, Any], namespace: str) -> bool:
        """Does ``ref`` resolve, by kind and name in ``namespace``, to an object of its uid?"""
        resource = OWNER_RESOURCES.get(ref.get("kind", ""))
        if resource is None:
            return True  # unresolvable kind: the real collector keeps retrying, never deletes
        owner = self.store.get(resource, namespace, ref.get("name", ""))
        return owner is not None and owner["metadata"]["uid"] == ref.get("uid")

    def _any_owner(self, refs: list[dict[str, Any]], namespace: str) -> bool:
        return any(self.owner_present(ref, namespace) for ref in refs)

    def _check(self, resource: str, namespace: str, name: str, uid: str) -> None:
        obj = self.store.get(resource, namespace, name)
        if obj is None or obj["metadata"]["uid"] != uid:
            return
        if obj["metadata"].get("deletionTimestamp"):
            return  # already being deleted: the collector does not delete twice
        refs = obj["metadata"].get("ownerReferences") or []
        if refs and not self._any_owner(refs, namespace):
            self._delete(resource, namespace, name, uid)
            self.collected += 1
            self.events.add("GarbageCollected", obj, "all owners are gone: deleted by the GC")
