"""A job's pool as pure books and decisions: warm pods per key, caps, trims, late pods.

The controller owns one :class:`JobPool` per job and executes what it decides (health
checks, creates, deletes, database writes); this module never does I/O, never imports
Django and reads time only from the injected ``clock``.

Invariants a reader must not break:
* A warm pod is a never-used pod (or, for checked reuse, a pod that passed its state
  check) keyed by ``(image, base_commit, cpu_millis, memory_bytes, workspace_bytes)``.
  It is handed out only to a request whose key is EQUAL: no "big enough" matching.
* Every sandbox the pool knows is in exactly one book: ``creating`` (a ticket, from the
  moment the create is admitted, before any token or database row), ``warm``,
  ``offered`` (a warm pod the web workers may claim straight from the database:
  ``sandboxes/controller/offers.py``; the controller acts on it only after withdrawing
  it), ``checking`` (taken for a health or state check) or ``in_use``. ``live_count`` is
  the sum, and admission never lets it exceed ``max_live``.
* A create is settled exactly once (:meth:`JobPool.settle`). Its pod becomes warm only if
  nobody used it, the job is not draining and the waiter is gone or it was a warm build;
  a pod an agent has seen is never warm again.
"""

from __future__ import annotations

import collections
import enum
import functools
import hashlib
import itertools
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field


@dataclass(frozen=True)
class PoolKey:
    """What a warm pod can serve: the image, its commit and the exact resource spec."""

    image: str
    base_commit: str | None
    cpu_millis: int
    memory_bytes: int
    workspace_bytes: int | None

    @functools.cached_property  # frozen: computed once (it is read on every create)
    def hash(self) -> str:
        return key_hash(self)


def key_hash(key: PoolKey) -> str:
    """A stable 16-hex-digit digest of the key (labels, database rows, dashboards)."""
    raw = json.dumps(
        [key.image, key.base_commit or "", key.cpu_millis, key.memory_bytes, key.workspace_bytes],
        separators=(",", ":"),
    )
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class PoolLimits:
    max_live: int
    max_creating: int
    warm_per_key: int = 0
    idle_timeout_s: float = 300.0


class Purpose(enum.StrEnum):
    ACQUIRE = "acquire"  # an acquire waits for this pod
    WARM = "warm"  # a warm build or a replacement


@dataclass
class WarmPod:
    sandbox_id: int
    key: PoolKey
    since: float
    role: str = "rollout"
    reused: bool = False  # True for a checked-reuse grading pod (source "reused")
    stamping: bool = False  # offered in the books, its row not stamped yet (offers.py)


@dataclass
class CreateTicket:
    """An admitted create. ``sandbox_id`` is set once its database row exists."""

    ticket_id: int
    key: PoolKey
    purpose: Purpose
    role: str
    admitted_at: float
    sandbox_id: int | None = None
    abandoned: bool = False  # the acquire that wanted it gave up (timeout, cancel)
    acquisition_id: int | None = None  # the waiting acquire's open row, linked at hand-out


class Settle(enum.StrEnum):
    HAND_OUT = "hand_out"  # give it to the waiting acquire
    WARM = "warm"  # keep it as a never-used warm pod
    DELETE = "delete"


@dataclass(frozen=True)
class Admission:
    """The answer to "may I create one more pod for this key?"."""

    ticket: CreateTicket | None
    evicted: WarmPod | None = None  # an idle warm pod of another key to delete first

    @property
    def admitted(self) -> bool:
        return self.ticket is not None


@dataclass
class JobPool:
    job_id: int
    limits: PoolLimits
    clock: Callable[[], float] = time.monotonic
    warm: dict[PoolKey, list[WarmPod]] = field(default_factory=dict)
    creating: dict[int, CreateTicket] = field(default_factory=dict)
    checking: dict[int, PoolKey] = field(default_factory=dict)
    in_use: dict[int, PoolKey] = field(default_factory=dict)
    offered: dict[int, WarmPod] = field(default_factory=dict)
    targets: dict[PoolKey, int] = field(default_factory=dict)
    last_request: dict[PoolKey, float] = field(default_factory=dict)
    draining: bool = False
    _ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    # Warm builds in ``creating`` per key, kept as tickets come and go: ``fill_plan`` runs
    # on every acquire, and counting ``creating`` there made a burst of N acquires of a job
    # with a warm target O(N^2) (``bench/pool_fill.py``).
    _warm_building: collections.Counter[PoolKey] = field(default_factory=collections.Counter)

    # -- counts -------------------------------------------------------------------------
    @property
    def warm_count(self) -> int:
        """Never-used pods waiting for an agent: the controller's and the offered ones."""
        return sum(len(pods) for pods in self.warm.values()) + len(self.offered)

    @property
    def live_count(self) -> int:
        return self.warm_count + len(self.creating) + len(self.checking) + len(self.in_use)

    def warm_for(self, key: PoolKey) -> int:
        offered = sum(1 for pod in self.offered.values() if pod.key == key)
        return len(self.warm.get(key, ())) + offered

    def creating_for(self, key: PoolKey, purpose: Purpose | None = None) -> int:
        return sum(
            1
            for t in self.creating.values()
            if t.key == key and (purpose is None or t.purpose == purpose)
        )

    def target_for(self, key: PoolKey) -> int:
        """Warm pods to keep for a key: the prewarm count or the job's per-key default."""
        default = self.limits.warm_per_key if key in self.last_request else 0
        return max(default, self.targets.get(key, 0))

    def snapshot(self) -> dict[str, object]:
        return {
            "job_id": self.job_id,
            "live": self.live_count,
            "warm": self.warm_count,
            "creating": len(self.creating),
            "checking": len(self.checking),
            "in_use": len(self.in_use),
            "offered": len(self.offered),
            "keys": {
                k.hash: {"warm": self.warm_for(k), "target": self.target_for(k)}
                for k in set(self.warm)
                | {p.key for p in self.offered.values()}
                | set(self.targets)
                | set(self.last_request)
            },
        }

    # -- requests and warm hand-out --------------------------------------------------------
    def note_request(self, key: PoolKey) -> None:
        """An acquire (or a prewarm) asked for this key now: it is not idle."""
        self.last_request[key] = self.clock()

    def set_target(self, key: PoolKey, count: int) -> None:
        """Prewarm: keep ``count`` warm pods of this key (counts as a request)."""
        self.note_request(key)
        self.targets[key] = max(0, int(count))

    def take_warm(self, key: PoolKey, role: str, *, never_used: bool = False) -> WarmPod | None:
        """Take the oldest warm pod whose key EQUALS the request, into ``checking``.

        A checked-reuse pod serves only its own role (a used grading pod never becomes a
        rollout pod); a never-used pod serves any role. ``never_used`` skips reused pods
        (a shadow grading's sandbox must be one no tenant touched).
        """
        if self.draining:
            return None
        pods = self.warm.get(key)
        if not pods:
            return None
        for index, pod in enumerate(pods):
            if pod.reused and (never_used or pod.role != role):
                continue
            del pods[index]
            if not pods:
                del self.warm[key]
            self.checking[pod.sandbox_id] = key
            return pod
        return None

    def hand_out(self, sandbox_id: int, key: PoolKey) -> None:
        """A pod (from ``checking`` or a settled create) now belongs to an agent."""
        self.checking.pop(sandbox_id, None)
        self.in_use[sandbox_id] = key

    def add_warm(self, pod: WarmPod) -> None:
        self.checking.pop(pod.sandbox_id, None)
        self.in_use.pop(pod.sandbox_id, None)
        self.warm.setdefault(pod.key, []).append(pod)

    def forget(self, sandbox_id: int) -> PoolKey | None:
        """Drop a sandbox from every book (it is being deleted or was released)."""
        key = self.checking.pop(sandbox_id, None) or self.in_use.pop(sandbox_id, None)
        offered = self.offered.pop(sandbox_id, None)
        if offered is not None:
            key = offered.key
        for wkey, pods in list(self.warm.items()):
            for pod in pods:
                if pod.sandbox_id == sandbox_id:
                    pods.remove(pod)
                    key = wkey
                    break
            if not pods:
                del self.warm[wkey]
        return key

    # -- offers to the web workers' direct hand-out (sandboxes/controller/offers.py) --------
    def offer_all(self) -> list[WarmPod]:
        """Move every never-used warm pod into ``offered`` and return them (the caller
        stamps their rows). Checked-reuse pods stay the controller's (they serve one role
        and are handed out as ``reused``), and so do idle ones (:meth:`trim` takes them)."""
        if self.draining:
            return []
        now = self.clock()
        moved: list[WarmPod] = []
        for key, pods in list(self.warm.items()):
            keep = [pod for pod in pods if pod.reused or self._idle(pod, now)]
            moved.extend(pod for pod in pods if not (pod.reused or self._idle(pod, now)))
            if keep:
                self.warm[key] = keep
            else:
                del self.warm[key]
        for pod in moved:
            pod.stamping = True
            self.offered[pod.sandbox_id] = pod
        return moved

    def stamped(self, pods: list[WarmPod], ids: set[int]) -> None:
        """The rows of ``ids`` are offered now; the other pods are warm again."""
        for pod in pods:
            pod.stamping = False
            if pod.sandbox_id in self.offered and pod.sandbox_id not in ids:
                self.withdrawn(pod)

    def offered_ids(self) -> list[int]:
        """The offered pods whose rows are stamped (a claimant can see them)."""
        return [sid for sid, pod in self.offered.items() if not pod.stamping]

    def claimed(self, sandbox_id: int) -> PoolKey | None:
        """An offered pod was claimed by a web worker: it is in use now (and its key was
        just asked for). None if it was not offered here (already followed)."""
        pod = self.offered.pop(sandbox_id, None)
        if pod is None:
            return None
        self.checking.pop(sandbox_id, None)
        self.in_use[sandbox_id] = pod.key
        self.note_request(pod.key)
        return pod.key

    def take_offered(self, key: PoolKey) -> WarmPod | None:
        """The oldest offered pod of an EQUAL key, into ``checking`` while the caller
        withdraws its offer (``withdrawn_to_check`` if that wins, ``hand_out`` if a web
        worker claimed it first)."""
        if self.draining:
            return None
        pods = [pod for pod in self.offered.values() if pod.key == key and not pod.stamping]
        if not pods:
            return None
        pod = min(pods, key=lambda p: p.since)
        del self.offered[pod.sandbox_id]
        self.checking[pod.sandbox_id] = key
        return pod

    def take_offered_to_evict(self, key: PoolKey) -> WarmPod | None:
        """What :meth:`admit` would evict for an acquire of ``key`` at ``max_live`` when
        no warm pod of another key is left but offered ones are: the longest-idle offered
        pod of another key (:meth:`_oldest_warm`'s order), into ``checking`` while the
        caller withdraws its offer (:meth:`withdrawn` puts a won one in ``warm``, where
        :meth:`admit` evicts it). None when :meth:`admit` needs none or none is offered."""
        if (
            self.draining
            or self.live_count < self.limits.max_live
            or self._oldest_warm(excluding=key) is not None
        ):
            return None
        pods = [pod for pod in self.offered.values() if pod.key != key and not pod.stamping]
        if not pods:
            return None
        pod = min(pods, key=lambda p: self.last_request.get(p.key, p.since))
        del self.offered[pod.sandbox_id]
        self.checking[pod.sandbox_id] = pod.key
        return pod

    def offer_back(self, pod: WarmPod) -> None:
        """A withdraw whose answer never came (:meth:`take_offered`'s pod): offered again,
        as far as the books know (the next round reads the row)."""
        self.checking.pop(pod.sandbox_id, None)
        self.offered[pod.sandbox_id] = pod

    def withdrawn(self, pod: WarmPod) -> None:
        """An offer the controller took back: a plain warm pod of the controller's again."""
        self.offered.pop(pod.sandbox_id, None)
        self.checking.pop(pod.sandbox_id, None)
        self.warm.setdefault(pod.key, []).append(pod)

    def idle_offered(self) -> list[WarmPod]:
        """Offered pods that :meth:`trim` would take if they were the controller's: the
        caller withdraws them first (a claimed one is in use, never trimmed)."""
        now = self.clock()
        return [pod for pod in self.offered.values() if not pod.stamping and self._idle(pod, now)]

    def _idle(self, pod: WarmPod, now: float) -> bool:
        """:meth:`trim`'s rule for one pod: idle from its key's last request, or from
        when it became warm if the key has none."""
        last = self.last_request.get(pod.key)
        return now - (pod.since if last is None else last) >= self.limits.idle_timeout_s

    def begin_check(self, sandbox_id: int) -> None:
        """A released pod is being checked for reuse: still live, not in use."""
        key = self.in_use.pop(sandbox_id, None)
        if key is not None:
            self.checking[sandbox_id] = key

    # -- admission ----------------------------------------------------------------------
    def admit(self, key: PoolKey, *, purpose: Purpose, role: str = "rollout") -> Admission:
        """Admit one create under ``max_live``, or refuse.

        An acquire at the cap may evict the longest-idle warm pod of ANOTHER key (a warm
        pod of its own key would have been handed out). A warm build never evicts.
        """
        if self.draining:
            return Admission(ticket=None)
        evicted: WarmPod | None = None
        if self.live_count >= self.limits.max_live:
            if purpose is not Purpose.ACQUIRE:
                return Admission(ticket=None)
            evicted = self._oldest_warm(excluding=key)
            if evicted is None:
                return Admission(ticket=None)
            self.forget(evicted.sandbox_id)
        ticket = CreateTicket(
            ticket_id=next(self._ids),
            key=key,
            purpose=purpose,
            role=role,
            admitted_at=self.clock(),
        )
        self.creating[ticket.ticket_id] = ticket
        if purpose is Purpose.WARM:
            self._warm_building[key] += 1
        return Admission(ticket=ticket, evicted=evicted)

    def _oldest_warm(self, *, excluding: PoolKey) -> WarmPod | None:
        candidates = [pod for key, pods in self.warm.items() if key != excluding for pod in pods]
        if not candidates:
            return None
        return min(candidates, key=lambda p: self.last_request.get(p.key, p.since))

    def fill_plan(self) -> list[PoolKey]:
        """Keys to start warm builds for (one entry per create), within ``max_live``."""
        if self.draining:
            return []
        room = self.limits.max_live - self.live_count
        plan: list[PoolKey] = []
        # Called on every acquire: the keys short of warm pods, less the warm builds already
        # under way (kept per key as tickets come and go, never counted here: a burst of N
        # acquires would cost O(N^2); bench/results/profile_*.txt, pool_fill.json).
        short = {
            key: want
            for key in sorted(set(self.targets) | set(self.last_request), key=lambda k: k.hash)
            if (want := self.target_for(key) - self.warm_for(key)) > 0
        }
        for key, want in short.items():
            deficit = want - self._warm_building.get(key, 0)
            for _ in range(max(0, deficit)):
                if room <= 0:
                    return plan
                plan.append(key)
                room -= 1
        return plan

    # -- settlement -----------------------------------------------------------------------
    def abandon(self, ticket: CreateTicket) -> None:
        """The acquire waiting on this create gave up; the create itself goes on."""
        ticket.abandoned = True

    def settle(self, ticket: CreateTicket, *, ready: bool, agent_used: bool = False) -> Settle:
        """Decide what becomes of a create that finished (Ready or failed).

        The ticket leaves ``creating``; the caller then calls :meth:`hand_out`,
        :meth:`add_warm` or nothing (delete), as answered.
        """
        left = self.creating.pop(ticket.ticket_id, None)
        if left is not None and left.purpose is Purpose.WARM:
            self._warm_building[left.key] -= 1
            if self._warm_building[left.key] <= 0:
                del self._warm_building[left.key]
        if not ready or self.draining or agent_used:
            return Settle.DELETE
        if ticket.purpose is Purpose.ACQUIRE and not ticket.abandoned:
            return Settle.HAND_OUT
        return Settle.WARM

    # -- trimming -----------------------------------------------------------------------
    def trim(self) -> list[WarmPod]:
        """Remove warm pods of keys not requested within ``idle_timeout_s``; return them.

        A key's idle time runs from its last request (acquire or prewarm); a warm pod of a
        key with no recorded request (a late pod after an earlier trim) idles from when it
        became warm. Trimmed keys also lose their prewarm target.
        """
        now = self.clock()
        limit = self.limits.idle_timeout_s
        trimmed: list[WarmPod] = []
        for key in list(set(self.warm) | set(self.last_request)):
            pods = self.warm.get(key, [])
            last = self.last_request.get(key)
            if last is None:
                idle = [p for p in pods if now - p.since >= limit]
            elif now - last >= limit:
                idle = list(pods)
                self.last_request.pop(key, None)
                self.targets.pop(key, None)
            else:
                idle = []
            for pod in idle:
                pods.remove(pod)
                trimmed.append(pod)
            if key in self.warm and not pods:
                del self.warm[key]
        return trimmed

    def drain(self) -> list[WarmPod]:
        """Stop building and hand-outs; return every warm pod (the caller deletes them)."""
        self.draining = True
        pods = [pod for group in self.warm.values() for pod in group]
        pods.extend(self.offered.values())  # deleted whether a web worker claimed it or not
        self.warm.clear()
        self.offered.clear()
        self.targets.clear()
        return pods

    @property
    def empty(self) -> bool:
        return self.live_count == 0


# -- checked reuse of grading pods (paper §4.3, Appendix I) -------------------------------
@dataclass(frozen=True)
class ReuseDecision:
    reuse: bool
    reason: str  # why it retires ("" when reused)
    verdicts: dict[str, str]  # the pod's verdict history after this grading


def reuse_decision(
    *,
    verdict: str,
    patch_sha256: str | None,
    suite: str | None,
    history: dict[str, str],
    reuse_count: int,
    max_uses: int,
) -> ReuseDecision:
    """May a released grading pod be checked and reused?

    It retires after a grading with no verdict, after ``max_uses`` reuses, or when its
    verdict contradicts an earlier one on this pod for the same patch and suite.
    """
    if verdict not in ("pass", "fail"):
        return ReuseDecision(False, "no_verdict", dict(history))
    if reuse_count >= max_uses:
        return ReuseDecision(False, "max_uses", dict(history))
    verdicts = dict(history)
    if patch_sha256:
        slot = f"{patch_sha256}:{suite or ''}"
        earlier = verdicts.get(slot)
        if earlier is not None and earlier != verdict:
            return ReuseDecision(False, "contradiction", verdicts)
        verdicts[slot] = verdict
    return ReuseDecision(True, "", verdicts)
