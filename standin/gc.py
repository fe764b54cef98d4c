"""The stand-in's garbage collector: dependents go when all their owners are gone.

Like Kubernetes' GC (background propagation): deleting an object schedules a check of
every object whose ``ownerReferences`` name its uid; the check deletes the dependent only
if none of its owners exists any more. With ``absent_owners`` on, an object created with
owner references that match nothing is collected too -- a real cluster does that, and it
catches a wrong uid or an owner in another namespace before production does.
"""

from __future__ import annotations

from standin.events import EventLog
from standin.sim import Simulation
from standin.store import Obj, Store

Dependent = tuple[str, str, str, str]  # resource, namespace, name, uid


class GarbageCollector:
    def __init__(
        self,
        *,
        store: Store,
        sim: Simulation,
        events: EventLog,
        delay_s: float,
        absent_owners: bool,
    ) -> None:
        self.store, self.sim, self.events = store, sim, events
        self.delay_s, self.absent_owners = delay_s, absent_owners
        self._dependents: dict[str, set[Dependent]] = {}
        self.collected = 0

    def on_created(self, resource: str, obj: Obj) -> None:
        meta = obj["metadata"]
        refs = meta.get("ownerReferences") or []
        dependent = (resource, meta["namespace"], meta["name"], meta["uid"])
        for ref in refs:
            self._dependents.setdefault(ref.get("uid", ""), set()).add(dependent)
        if self.absent_owners and refs and not self._any_owner(refs):
            self.sim.after(self.delay_s, self._check, *dependent)

    def on_deleted(self, resource: str, obj: Obj) -> None:
        for dependent in self._dependents.pop(obj["metadata"]["uid"], set()):
            self.sim.after(self.delay_s, self._check, *dependent)

    def _any_owner(self, refs: list[dict[str, str]]) -> bool:
        return any(self.store.by_uid(ref.get("uid", "")) is not None for ref in refs)

    def _check(self, resource: str, namespace: str, name: str, uid: str) -> None:
        obj = self.store.get(resource, namespace, name)
        if obj is None or obj["metadata"]["uid"] != uid:
            return
        refs = obj["metadata"].get("ownerReferences") or []
        if refs and not self._any_owner(refs):
            self.store.delete(resource, namespace, name, uid=uid)
            self.collected += 1
            self.events.add("GarbageCollected", obj, "all owners are gone: deleted by the GC")
