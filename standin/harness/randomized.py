"""Randomized ownership trials: a random gate, trigger and failure plans per trial (seeded).

Each trial draws where to hold (a gate point), what to break (create, delete and pod
failure plans, or another tenant's pod taking the name) and how to trigger (cancel the
caller, cancel the controller's create task too, expire the acquire timeout, drain, or
nothing), then runs the same audit and settlement as the windows: no pod may ever be
without an owner and the job must end with no pod, no anchor and no pending delete.

Plans are drawn so that the chosen gate is reachable (a gate after the store is never
paired with a create that is refused before it): every trial records ``reached`` and
the CI test requires it, so a trial cannot pass by holding nothing. Delete plans that
hang are left to window 21 (their client timeout is wall time).
"""

from __future__ import annotations

import random
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from standin.harness.rig import LONG_S, TIMEOUT_S, Rig, Trial
from standin.harness.support import NS, other_tenant_pod

CREATE_PLANS = [
    "403",
    "500_before_store",
    "504_after_store",
    "reset_before_store",
    "reset_after_store",
]
STORED = {None, "504_after_store", "reset_after_store"}  # the pod gets stored
# gate -> (allowed create plans, allowed pod plans)
GATES: dict[tuple[str, str | None], tuple[list[str | None], list[str | None]]] = {
    ("work_item", "create"): ([None, *CREATE_PLANS, "name_taken"], [None, "fail_start"]),
    ("create_received", None): ([None, *CREATE_PLANS], [None, "fail_start", "never_ready"]),
    ("create_stored", None): ([None, "504_after_store", "reset_after_store"], [None]),
    ("probe", None): ([None], [None, "never_ready"]),
    ("ready", None): ([None], [None]),
    ("work_item", "health"): ([None], [None]),
    ("delete_received", None): (["504_after_store", "reset_after_store"], [None]),
}
TRIGGERS = ["cancel", "cancel_create", "timeout", "drain", "none"]
DELETE_PLANS: list[str | None] = [None, None, "500_not_applied", "reset_after_apply"]


@dataclass
class Draw:
    index: int
    seed: int
    start: str  # "acquire" | "prewarm"
    role: str
    gate: tuple[str, str | None]
    create_plan: str | None
    pod_plan: str | None
    delete_plan: str | None
    trigger: str
    reached: bool = False
    audits: int = 0
    ownerless: list[str] = field(default_factory=list)
    caller: str = ""
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["gate"] = ":".join(p for p in self.gate if p)
        return out


def draw(index: int, seed: int) -> Draw:
    rng = random.Random(seed * 1_000_003 + index)
    gate = rng.choice(sorted(GATES, key=str))
    creates, pods = GATES[gate]
    create_plan = rng.choice(creates)
    pod_plan = rng.choice(pods) if create_plan in STORED else None
    return Draw(
        index=index,
        seed=seed,
        start=rng.choice(["acquire", "acquire", "acquire", "prewarm"]),
        role=rng.choice(["rollout", "grading"]),
        gate=gate,
        create_plan=create_plan,
        pod_plan=pod_plan,
        delete_plan=rng.choice(DELETE_PLANS),
        trigger=rng.choice(TRIGGERS),
    )


def run_trial(rig: Rig, d: Draw) -> Draw:
    """Run one drawn trial to settlement; raise AssertionError on any ownerless pod."""
    started = time.monotonic()
    t = Trial(rig)
    point, verb = d.gate
    gate = t.gate(point, verb=verb)
    if d.create_plan and d.create_plan != "name_taken":
        t.plan("create", d.create_plan)
    if d.pod_plan:
        t.plan("pod", d.pod_plan)
    if d.delete_plan:
        t.plan("delete", d.delete_plan)
    call = None
    if d.start == "prewarm":
        t.prewarm(1, role=d.role)
    else:
        timeout = TIMEOUT_S if d.trigger == "timeout" else LONG_S
        call = t.acquire(role=d.role, timeout_s=timeout)
    name = t.reached(gate)
    d.reached = True
    if d.create_plan == "name_taken":
        holder = t.cluster.put_pod(NS, other_tenant_pod(name))
        rig.sentinels[name] = holder["metadata"]["uid"]
    if d.trigger == "cancel" and call is not None:
        t.cancel(call)
    elif d.trigger == "cancel_create":
        if call is not None:
            t.cancel(call)
        t.cancel_create()
    elif d.trigger == "timeout":
        t.expire()
    elif d.trigger == "drain":
        t.drain()
    t.audit("held")
    t.settle(expire_budgets=True)
    if call is not None:
        outcome = t.outcome(call, timeout=5)
        d.caller = type(outcome).__name__
    d.audits = len(t.audits)
    d.ownerless = sorted({n for a in t.audits for n in a.ownerless})
    d.seconds = time.monotonic() - started
    return d
