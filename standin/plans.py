"""Failure plans: change the answer of matching calls, one-shot or N times.

A plan names the call it changes (``create``, ``delete`` or a pod's lifecycle ``pod``),
what happens instead (an action below) and which objects it applies to (the resource,
``pods`` unless said; a name prefix, label selector or a predicate). The stand-in consults
plans at fixed points, after the ``*_received`` gate and, for "after store/apply" actions,
after the store changed:

create: ``403`` (nothing stored), ``409`` (answer AlreadyExists, nothing stored),
    ``500_before_store``, ``504_after_store``, ``reset_before_store``,
    ``reset_after_store`` (the reply is lost: connection aborted), ``504_store_later`` /
    ``reset_store_later`` (answer 504 / drop the connection with nothing stored, then store
    the pod ``delay_s`` simulated seconds later: a create the API server committed after
    its request had timed out), ``429`` (API Priority and Fairness sheds it: nothing
    stored, ``Retry-After``), ``webhook_timeout`` (a validating admission webhook timed
    out: 500, nothing stored).
list, watch: ``429`` (shed before any item is read; ``Retry-After: retry_after_s``);
    watch: ``drop`` (the stream's connection breaks after its initial events).
delete: ``500_not_applied``, ``reset_after_apply`` (applied, reply lost),
    ``hang_not_applied`` / ``hang_after_apply`` (no answer until the client gives up).
pod: ``fail_start`` (phase Failed while starting), ``never_ready`` (Running, never Ready),
    ``bad_image`` (the task image cannot be pulled: ErrImagePull -> ImagePullBackOff),
    ``carrier_outage`` (the init container's carrier image cannot be pulled: the registry
    is unreachable); see ``pullfail.py``.
create: ``scheduling_gate`` also: stored, with a scheduling gate a mutating webhook added.

Invariant: a plan fires at most ``times`` times (``None`` = every match), and each firing
is counted in ``fired`` so a test can assert its trigger really happened.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from standin.selectors import Requirement, labels_match, parse_label_selector

ACTIONS: dict[str, frozenset[str]] = {
    "create": frozenset(
        {
            "403",
            "409",
            "500_before_store",
            "504_after_store",
            "reset_before_store",
            "reset_after_store",
            "429",
            "webhook_timeout",
            "504_store_later",
            "reset_store_later",
            "scheduling_gate",
        }
    ),
    "list": frozenset({"429"}),
    "watch": frozenset({"429", "drop"}),
    "delete": frozenset(
        {"500_not_applied", "reset_after_apply", "hang_not_applied", "hang_after_apply"}
    ),
    "pod": frozenset({"fail_start", "never_ready", "bad_image", "carrier_outage"}),
}


@dataclass
class Plan:
    verb: str
    action: str
    name_prefix: str | None = None
    selector: tuple[Requirement, ...] = ()
    predicate: Callable[[str, Mapping[str, str]], bool] | None = None
    times: int | None = 1
    retry_after_s: int = 1  # the Retry-After of a ``429`` answer
    resource: str = "pods"  # what it applies to: "pods", "secrets", "configmaps"
    fired: int = 0
    names: list[str] = field(default_factory=list)
    delay_s: float = 0.0  # the ``*_store_later`` actions: simulated seconds until stored

    def applies(self, name: str, labels: Mapping[str, str], resource: str = "pods") -> bool:
        if resource != self.resource:
            return False
        if self.times is not None and self.fired >= self.times:
            return False
        if self.name_prefix is not None and not name.startswith(self.name_prefix):
            return False
        if self.selector and not labels_match(self.selector, labels):
            return False
        return self.predicate is None or self.predicate(name, labels)

    @property
    def exhausted(self) -> bool:
        return self.times is not None and self.fired >= self.times


class PlanRegistry:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._plans: list[Plan] = []

    def add(
        self,
        verb: str,
        action: str,
        *,
        name_prefix: str | None = None,
        label_selector: str | None = None,
        predicate: Callable[[str, Mapping[str, str]], bool] | None = None,
        times: int | None = 1,
        retry_after_s: int = 1,
        resource: str = "pods",
        delay_s: float = 0.0,
    ) -> Plan:
        if action not in ACTIONS.get(verb, frozenset()):
            raise ValueError(f"unknown plan {verb}/{action}; known: {ACTIONS}")
        plan = Plan(
            verb,
            action,
            name_prefix=name_prefix,
            selector=parse_label_selector(label_selector),
            predicate=predicate,
            times=times,
            retry_after_s=retry_after_s,
            resource=resource,
            delay_s=delay_s,
        )
        with self._lock:
            self._plans.append(plan)
        return plan

    def take(
        self, verb: str, name: str, labels: Mapping[str, str] | None, actions: frozenset[str]
    ) -> str | None:
        """Fire the first live plan for this call among ``actions``; return its action."""
        plan = self.take_plan(verb, name, labels, actions)
        return None if plan is None else plan.action

    def take_plan(
        self,
        verb: str,
        name: str,
        labels: Mapping[str, str] | None,
        actions: frozenset[str],
        resource: str = "pods",
    ) -> Plan | None:
        """Like :meth:`take`, but the plan itself (its ``retry_after_s``, say)."""
        with self._lock:
            for plan in self._plans:
                if plan.verb == verb and plan.action in actions:
                    if plan.applies(name, labels or {}, resource):
                        plan.fired += 1
                        plan.names.append(name)
                        return plan
        return None

    def peek(self, verb: str, name: str, labels: Mapping[str, str] | None, action: str) -> bool:
        """True if a live plan would fire for this call, without firing it."""
        with self._lock:
            return any(
                p.verb == verb and p.action == action and p.applies(name, labels or {})
                for p in self._plans
            )

    def plans(self) -> list[Plan]:
        with self._lock:
            return list(self._plans)

    def clear(self) -> None:
        with self._lock:
            self._plans.clear()
