"""Leader election on a coordination.k8s.io/v1 Lease with the official client's elector.

Two candidates in this process against the stand-in API server over HTTP: exactly one
holds the Lease and runs its ``on_started``; when the holder stops renewing (its candidacy
ends, the Lease is left held, as a SIGKILLed replica leaves it) the other takes it once the
Lease duration has passed. A holder that resigns (an orderly stop) releases the Lease as
client-go's ``ReleaseOnCancel`` does -- an empty holder and a 1 s duration, written after
its work stopped -- and the standby takes it at its next retry, long before the Lease would
have expired (client-go leader election:
https://pkg.go.dev/k8s.io/client-go/tools/leaderelection#LeaderElectionConfig). Readiness
follows leadership (``/readyz``). The local backend never elects. Leases:
https://kubernetes.io/docs/concepts/architecture/leases/
"""

from __future__ import annotations

import datetime as dt
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
# A Lease that outlives the test: a standby that leads did not wait for it to expire.
LONG = {"lease_duration_s": 60, "renew_deadline_s": 10, "retry_period_s": 1}
LEASE = "sandman-controller"


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
    def __init__(
        self, cluster: StandinCluster, identity: str, timing: dict[str, int] = FAST
    ) -> None:
        self.started = threading.Event()
        self.lost = threading.Event()
        self.elector = election.LeaderElector(
            election.ElectionSettings(namespace=NS, identity=identity, **timing),
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


def _time(value: str) -> dt.datetime:
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00"))


def test_a_resigning_holder_stops_its_work_while_holding_then_releases_and_the_standby_leads(
    cluster: StandinCluster,
) -> None:
    a, b = Candidate(cluster, "replica-a", LONG), Candidate(cluster, "replica-b", LONG)
    try:
        first = wait_until(
            lambda: next((c for c in (a, b) if c.elector.leading), None), what="a leader"
        )
        other = b if first is a else a
        wait_until(lambda: other.elector.holder() is not None, what="the standby's read")
        seen_in_stop: list[str | None] = []

        def stop_work() -> bool:
            # Still the holder, still renewing: nobody else may act while the work stops.
            renewals = len(cluster.lease_writes(NS, LEASE))
            wait_until(lambda: len(cluster.lease_writes(NS, LEASE)) > renewals, what="a renewal")
            seen_in_stop.append(holder(cluster))
            assert not other.started.is_set()
            return True

        assert first.elector.resign(stop_work) is True
        assert seen_in_stop == [first.elector.identity]
        assert not first.elector.leading and not first.lost.is_set()
        wait_until(lambda: other.elector.leading, what="the standby to take the released Lease")

        writes = [w["lease"]["spec"] for w in cluster.lease_writes(NS, LEASE)]
        holders = [spec["holderIdentity"] for spec in writes]
        released = holders.index("")
        assert writes[released]["leaseDurationSeconds"] == 1  # client-go's release()
        assert holders[released - 1] == first.elector.identity
        assert other.elector.identity not in holders[:released]
        assert holders[released + 1] == other.elector.identity
        # It took the Lease before the old record could have expired: only the release
        # allowed that (the standby's retry period, not the 60 s duration).
        last_renewal = _time(writes[released - 1]["renewTime"])
        taken = _time(writes[released + 1]["acquireTime"])
        assert taken < last_renewal + dt.timedelta(seconds=LONG["lease_duration_s"])
        assert first.elector.retry_after_s() == LONG["retry_period_s"]
    finally:
        a.elector.stop()
        b.elector.stop()


def test_a_holder_whose_work_did_not_stop_cleanly_keeps_the_lease_to_expire(
    cluster: StandinCluster,
) -> None:
    a, b = Candidate(cluster, "replica-a", LONG), Candidate(cluster, "replica-b", LONG)
    try:
        first = wait_until(
            lambda: next((c for c in (a, b) if c.elector.leading), None), what="a leader"
        )
        other = b if first is a else a
        wait_until(lambda: other.elector.holder() is not None, what="the standby's read")
        called: list[str] = []
        assert other.elector.resign(lambda: called.append("standby") is None) is False
        assert called == []  # a standby has no work to stop and nothing to release
        assert first.elector.resign(lambda: False) is False
        writes = [w["lease"]["spec"]["holderIdentity"] for w in cluster.lease_writes(NS, LEASE)]
        assert "" not in writes and holder(cluster) == first.elector.identity
        assert not first.elector.leading
    finally:
        a.elector.stop()
        b.elector.stop()
