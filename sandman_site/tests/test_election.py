"""Leader election on a coordination.k8s.io/v1 Lease with the official client's elector.

Two candidates in this process against the stand-in API server over HTTP: exactly one
holds the Lease and runs its ``on_started``; when the holder stops renewing (its candidacy
ends, the Lease is left held, as a SIGKILLed replica leaves it) the other takes it once the
Lease duration has passed. Readiness follows leadership (``/readyz``). The local backend
never elects. Leases: https://kubernetes.io/docs/concepts/architecture/leases/
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
from django.test import Client
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sandman_site import election, startup
from sandman_site.env import ConfigError
from standin import StandinCluster
from standin.harness.support import wait_until

NS = "sandman-system"
FAST = {"lease_duration_s": 3, "renew_deadline_s": 2, "retry_period_s": 1}


@pytest.fixture
def cluster() -> Iterator[StandinCluster]:
    with StandinCluster(nodes=1) as c:
        yield c


@pytest.fixture
def no_current() -> Iterator[None]:
    election.set_current(None)
    yield
    election.set_current(None)


def api_client(cluster: StandinCluster) -> client.ApiClient:
    configuration = client.Configuration()
    configuration.host = cluster.url
    return client.ApiClient(configuration)


class Candidate:
    def __init__(self, cluster: StandinCluster, identity: str) -> None:
        self.started = threading.Event()
        self.lost = threading.Event()
        self.elector = election.LeaderElector(
            election.ElectionSettings(namespace=NS, identity=identity, **FAST),
            api_client=api_client(cluster),
            on_started=self.started.set,
            on_stopped=self.lost.set,
        )
        self.elector.start()


def holder(cluster: StandinCluster) -> str | None:
    lease = cluster.lease(NS, "sandman-controller")
    return None if lease is None else lease["spec"]["holderIdentity"]


def test_exactly_one_candidate_leads_and_the_other_takes_over_when_it_stops_renewing(
    cluster: StandinCluster,
) -> None:
    a, b = Candidate(cluster, "replica-a"), Candidate(cluster, "replica-b")
    try:
        first = wait_until(
            lambda: next((c for c in (a, b) if c.elector.leading), None), what="a leader"
        )
        other = b if first is a else a
        assert holder(cluster) == first.elector.identity
        assert not other.elector.leading and not other.started.is_set()
        assert cluster.lease(NS, "sandman-controller")["spec"]["leaseDurationSeconds"] == 3
        first.elector.stop()  # no more renewals; the Lease stays held until it expires
        wait_until(lambda: other.elector.leading, what="the standby to take the Lease")
        assert holder(cluster) == other.elector.identity
        assert not first.lost.is_set() and not other.lost.is_set()
    finally:
        a.elector.stop()
        b.elector.stop()


def test_a_leader_that_cannot_renew_stops_leading_and_says_so(cluster: StandinCluster) -> None:
    a = Candidate(cluster, "replica-a")
    try:
        wait_until(lambda: a.elector.leading, what="the leader")
        stale = cluster.lease(NS, "sandman-controller")
        # Another writer takes the Lease: every renewal of replica-a now conflicts (409).
        api = client.CoordinationV1Api(api_client(cluster))

        def take_over() -> bool:
            # read-modify-replace with the resourceVersion read: a renewal of replica-a in
            # between is a 409 (optimistic concurrency), and the intruder reads again
            current = api.read_namespaced_lease("sandman-controller", NS)
            current.spec.holder_identity = "intruder"
            current.spec.lease_duration_seconds = 3600
            try:
                api.replace_namespaced_lease("sandman-controller", NS, current)
            except ApiException as exc:
                if exc.status != 409:
                    raise
                return False
            return True

        wait_until(take_over, what="the intruder's replace")
        assert stale["spec"]["holderIdentity"] == "replica-a"
        wait_until(lambda: a.lost.is_set(), what="replica-a to stop leading")
        assert not a.elector.leading
    finally:
        a.elector.stop()


def test_readyz_is_503_not_leader_on_a_standby_and_200_on_the_leader(
    cluster: StandinCluster, no_current: None, db: None
) -> None:
    a, b = Candidate(cluster, "replica-a"), Candidate(cluster, "replica-b")
    try:
        leader = wait_until(
            lambda: next((c for c in (a, b) if c.elector.leading), None), what="a leader"
        )
        standby = b if leader is a else a
        election.set_current(standby.elector)
        wait_until(lambda: standby.elector.holder() is not None, what="the standby's read")
        answer = Client().get("/readyz")
        assert answer.status_code == 503
        body = answer.json()
        assert body["error"] == "not_leader" and leader.elector.identity in body["detail"]
        election.set_current(leader.elector)
        answer = Client().get("/readyz")
        assert answer.status_code == 200 and answer.json()["leading"] is True
        election.set_current(None)  # one process, no election: ready with a database
        assert Client().get("/readyz").json() == {
            "ok": True,
            "database": True,
            "leader_election": False,
        }
    finally:
        a.elector.stop()
        b.elector.stop()


def test_the_local_backend_never_elects_and_bad_timings_are_a_config_error() -> None:
    conf = SimpleNamespace(SANDMAN_BACKEND="local", SANDMAN_LEADER_ELECTION=True)
    assert not startup.election_wanted(conf)
    conf = SimpleNamespace(SANDMAN_BACKEND="kubernetes", SANDMAN_LEADER_ELECTION=True)
    assert startup.election_wanted(conf)
    with pytest.raises(ConfigError, match="greater than the renew deadline"):
        election.ElectionSettings(
            namespace=NS, identity="x", lease_duration_s=10, renew_deadline_s=10
        ).check()
    with pytest.raises(ConfigError, match="1.2 x the retry period"):
        election.ElectionSettings(
            namespace=NS, identity="x", lease_duration_s=5, renew_deadline_s=2, retry_period_s=2
        ).check()
