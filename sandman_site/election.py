"""Leader election for replicas on Kubernetes: exactly one replica runs the controller.

Every replica of the service runs the official client's elector
(``kubernetes.leaderelection.LeaderElection`` with its ``LeaseLock``) on one
``coordination.k8s.io/v1`` Lease. The replica that holds the Lease starts the controller
(which reconciles from the database and the cluster before it counts as started) and the
grading runner, and labels its own pod ``sandman.dev/leader=true`` (:class:`LeaderMark`), which
the trainers' Service selects; the others serve reads (pages, lists, ``/metrics``), answer
acquires ``503 controller_unavailable`` and ``/readyz`` ``503 not_leader``
(docs/architecture.md §4.1).

Rules a reader must not break:

* The elector's timing is client-go's: a leader that cannot renew within
  ``renew_deadline_s`` stops leading, and ``renew_deadline_s < lease_duration_s``, so the
  old leader has given up before a standby may take the Lease. A replica that stopped
  leading exits (``on_stopped``, as client-go controllers ``klog.Fatal``): its in-memory
  pool books are no longer the truth, and the kubelet restarts it as a fresh standby.
* The Lease client is built, never global (``build_api_client``): the official
  ``LeaseLock`` builds a default-configured ``CoordinationV1Api``, which is replaced with
  one on our configuration before the elector runs.
* The elector's loop has no stop of its own; :class:`_SwitchedLock` wraps the lock and
  raises :class:`ElectionStopped` on its next call after :meth:`LeaderElector.stop`.
* An orderly stop releases the Lease as client-go's ``ReleaseOnCancel`` does
  (:meth:`LeaderElector.resign`), in this order and never another: the work the Lease
  guards stops while the elector still renews (nobody else may act meanwhile), the
  elector's thread ends (no renewal in flight), and only then the holder writes the record
  with an empty holder and a 1 s duration through the same ``LeaseLock``. A standby's
  elector takes an empty-holder Lease at its next retry, not after the duration. If the
  work did not stop cleanly, nothing is released: the Lease expires as after a crash.
"""

from __future__ import annotations

import datetime as dt
import logging
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.leaderelection import electionconfig, leaderelection
from kubernetes.leaderelection.leaderelectionrecord import LeaderElectionRecord
from kubernetes.leaderelection.resourcelock.leaselock import LeaseLock

from sandboxes import labels as L
from sandman_site.env import ConfigError

log = logging.getLogger(__name__)


class ElectionStopped(Exception):
    """Raised inside the elector's thread to end it (see :meth:`LeaderElector.stop`)."""


@dataclass(frozen=True)
class ElectionSettings:
    """The Lease and the elector's timing (client-go's defaults: 15 s, 10 s, 2 s)."""

    namespace: str
    identity: str
    lease_name: str = "sandman-controller"
    lease_duration_s: int = 15
    renew_deadline_s: int = 10
    retry_period_s: int = 2

    def check(self) -> None:
        """The elector's own rules (it would ``sys.exit`` on them), as a clear error."""
        if min(self.lease_duration_s, self.renew_deadline_s, self.retry_period_s) < 1:
            raise ConfigError("lease duration, renew deadline and retry period must be >= 1 s")
        if self.lease_duration_s <= self.renew_deadline_s:
            raise ConfigError("SANDMAN_LEASE_DURATION_S must be greater than the renew deadline")
        if self.renew_deadline_s <= 1.2 * self.retry_period_s:
            raise ConfigError("SANDMAN_LEASE_RENEW_DEADLINE_S must exceed 1.2 x the retry period")
        if not self.identity or not self.namespace:
            raise ConfigError("leader election needs an identity and a namespace")


def default_identity() -> str:
    """client-go's convention: the host name plus a random suffix (unique per process)."""
    return f"{socket.gethostname()}_{uuid.uuid4().hex[:12]}"


class _SwitchedLock:
    """The official ``LeaseLock`` behind a stop switch; same interface, by composition."""

    def __init__(self, lock: LeaseLock, stopped: threading.Event) -> None:
        self._lock = lock
        self._stopped = stopped
        self.name, self.namespace, self.identity = lock.name, lock.namespace, lock.identity

    def _check(self) -> None:
        if self._stopped.is_set():
            raise ElectionStopped()

    def get(self, name: str, namespace: str) -> tuple[bool, Any]:
        self._check()
        return self._lock.get(name, namespace)

    def create(self, name: str, namespace: str, election_record: Any) -> bool:
        self._check()
        return bool(self._lock.create(name, namespace, election_record))

    def update(self, name: str, namespace: str, updated_record: Any) -> bool:
        self._check()
        return bool(self._lock.update(name, namespace, updated_record))


class LeaderMark:
    """The ``sandman.dev/leader=true`` label on this replica's own pod while it leads.

    The trainers' Service selects it, so acquires go to the leader while every replica
    stays Ready for reads, rollouts and the PodDisruptionBudget (the pattern of
    CloudNativePG's primary label). A replica clears its own label before it campaigns, so
    a restarted leader never keeps trainers' traffic.
    """

    def __init__(self, api_client: client.ApiClient, *, pod: str, namespace: str) -> None:
        self._core = client.CoreV1Api(api_client)
        self.pod, self.namespace = pod, namespace

    def set(self, leading: bool) -> None:
        body = {"metadata": {"labels": {L.LEADER: "true" if leading else None}}}
        self._core.patch_namespaced_pod(
            self.pod, self.namespace, body, _content_type="application/merge-patch+json"
        )


class LeaderElector:
    """One replica's candidacy. ``on_started`` runs once this replica holds the Lease (in
    the elector's worker thread); ``leading`` turns true only after it returned.
    ``on_stopped`` runs when renewing failed past the deadline. ``clock`` is wall-clock
    seconds, the official elector's own time base (the times in its records)."""

    # client-go's release(): an empty holder and a 1-second duration (leaderelection.go).
    RELEASED_DURATION_S = 1

    def __init__(
        self,
        config: ElectionSettings,
        *,
        api_client: client.ApiClient,
        on_started: Callable[[], None],
        on_stopped: Callable[[], None],
        mark: LeaderMark | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        config.check()
        self.config = config
        self._mark = mark
        self._clock = clock
        self._on_started = on_started
        self._on_stopped = on_stopped
        self._stopped = threading.Event()
        self._leading = threading.Event()
        self._lock = lock = LeaseLock(config.lease_name, config.namespace, config.identity)
        lock.api_instance = client.CoordinationV1Api(api_client)
        self._election = leaderelection.LeaderElection(
            electionconfig.Config(
                _SwitchedLock(lock, self._stopped),
                lease_duration=config.lease_duration_s,
                renew_deadline=config.renew_deadline_s,
                retry_period=config.retry_period_s,
                onstarted_leading=self._started,
                onstopped_leading=self._lost,
            )
        )
        self._thread: threading.Thread | None = None

    @property
    def identity(self) -> str:
        return self.config.identity

    @property
    def leading(self) -> bool:
        return self._leading.is_set()

    def holder(self) -> str | None:
        """The holder this replica last saw in the Lease (None before its first read)."""
        record = self._election.observed_record
        return None if record is None else record.holder_identity

    def retry_after_s(self) -> int:
        """When a refused acquire is worth resending (``Retry-After``, whole seconds): the
        retry period, the soonest a standby can have taken a released Lease. (After a
        crash it takes the duration; a client's backoff covers that.)"""
        return self.config.retry_period_s

    def start(self) -> None:
        """Clear this pod's leader label (a restarted leader's), then campaign."""
        if self._mark is not None:
            self._mark.set(False)
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="sandman-leader-election", daemon=True
            )
            self._thread.start()

    def stop(self, timeout_s: float | None = None) -> None:
        """End the candidacy at the elector's next Lease call (a held Lease then expires)."""
        self._stopped.set()
        if self._thread is not None:
            self._thread.join(
                timeout_s if timeout_s is not None else self.config.retry_period_s + 5
            )

    def wait_started(self, timeout_s: float) -> bool:
        """Whether this replica leads, after waiting up to ``timeout_s`` if it holds the
        Lease while its controller is still starting (``on_started`` running: the
        reconcile), so that a stop then is the orderly one -- work stopped, Lease released
        -- not a holder left renewing with nothing served until the process ends."""
        if self.leading or self.holder() != self.identity:
            return self.leading
        log.warning("%s holds the Lease, its controller is starting: waiting", self.identity)
        return self._leading.wait(timeout_s)

    def resign(self, stop_work: Callable[[], bool]) -> bool:
        """An orderly stop (SIGTERM): True if this replica held the Lease and released it.

        A standby ends its candidacy (a stopping process never takes the Lease); a holder
        still starting its controller keeps renewing until the process ends (then the
        Lease expires; ``startup`` first lets such a start end: ``wait_started``). The
        holder that leads first runs ``stop_work`` (the grading runner and the controller
        stop; it returns whether they did, cleanly) while its elector
        keeps renewing, clears its leader label, ends the elector's thread, and then
        releases the Lease."""
        if not self.leading:
            if self.holder() != self.identity:
                self.stop()
            return False
        stopped = stop_work()
        log.warning("%s resigning; its controller stopped cleanly: %s", self.identity, stopped)
        if self._mark is not None:
            try:
                self._mark.set(False)
            except (ApiException, urllib3.exceptions.HTTPError):
                log.warning("could not clear the leader label of %s", self.identity, exc_info=True)
        self._leading.clear()
        self.stop()
        if not stopped or (self._thread is not None and self._thread.is_alive()):
            log.warning("%s does not release its Lease: it did not stop cleanly", self.identity)
            return False
        return self._release()

    def _release(self) -> bool:
        """client-go's ``release()``: the holder writes an empty holder and a 1 s duration
        through the same lock (a fresh read: the replace carries the current version, so a
        Lease someone else took meanwhile is a 409, never overwritten)."""
        name, ns = self.config.lease_name, self.config.namespace
        try:
            found, record = self._lock.get(name, ns)
            if not found or record.holder_identity != self.identity:
                log.warning("%s does not hold Lease %s/%s: no release", self.identity, ns, name)
                return False
            now = str(dt.datetime.fromtimestamp(self._clock()))  # the elector's record format
            empty = LeaderElectionRecord("", str(self.RELEASED_DURATION_S), now, now)
            released = bool(self._lock.update(name, ns, empty))
        except (ApiException, urllib3.exceptions.HTTPError):
            log.warning("releasing Lease %s/%s failed", ns, name, exc_info=True)
            return False
        log.warning("%s released Lease %s/%s: %s", self.identity, ns, name, released)
        return released

    def _run(self) -> None:
        try:
            self._election.run()
        except ElectionStopped:
            log.info("leader election of %s stopped", self.identity)

    def _started(self) -> None:
        log.info(
            "%s holds Lease %s/%s", self.identity, self.config.namespace, self.config.lease_name
        )
        self._on_started()
        if self._mark is not None:
            self._mark.set(True)
        self._leading.set()

    def _lost(self) -> None:
        was_leading = self._leading.is_set()
        self._leading.clear()
        if self._stopped.is_set():
            return
        log.critical("%s stopped leading (leading=%s)", self.identity, was_leading)
        self._on_stopped()


_current: LeaderElector | None = None


def current() -> LeaderElector | None:
    """This process's elector, or None (local backend, election off, not serving)."""
    return _current


def describe() -> dict[str, Any]:
    """This process's election as ``/readyz`` reports it: ``leader_election``, and with an
    elector its ``identity``, whether it is ``leading`` and the ``holder`` it last saw."""
    elector = current()
    if elector is None:
        return {"leader_election": False}
    return {
        "leader_election": True,
        "identity": elector.identity,
        "leading": elector.leading,
        "holder": elector.holder(),
    }


def set_current(elector: LeaderElector | None) -> None:
    global _current
    _current = elector
