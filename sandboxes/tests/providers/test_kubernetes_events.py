"""Reading core/v1 Events into per-pod facts: message formats, aggregation, unknown vs zero."""

from __future__ import annotations

import datetime as dt
from typing import Any

from sandboxes.providers.base import ReadyInfo
from sandboxes.providers.kubernetes.events import EventFacts, go_duration_s

T = "2026-01-01T00:00:0{}Z"


def ev(reason: str, message: str, *, at: int, path: str | None = None, **extra: Any) -> Any:
    involved = {"kind": "Pod", "name": "p", "uid": "u1", **({"fieldPath": path} if path else {})}
    return {
        "metadata": {"name": extra.pop("name", f"p.{reason}.{at}")},
        "involvedObject": involved,
        "reason": reason,
        "message": message,
        "firstTimestamp": T.format(at),
        "lastTimestamp": T.format(extra.pop("last", at)),
        "count": extra.pop("count", 1),
        **extra,
    }


MAIN, CARRIER = "spec.containers{sandbox}", "spec.initContainers{execd-carrier}"


def test_go_durations_parse_as_the_kubelet_prints_them() -> None:
    assert go_duration_s("3.2s") == 3.2 and go_duration_s("512ms") == 0.512
    assert go_duration_s("1m4.25s") == 64.25 and go_duration_s("1h2m") == 3720.0
    assert go_duration_s("soon") is None and go_duration_s("3.2s!") is None


def test_a_pulled_image_gives_the_pull_time_including_waiting_from_the_task_container() -> None:
    """kubelet ``images/image_manager.go``: 'Successfully pulled image "x" in 1.5s (2.5s
    including waiting). Image size: N bytes.'; the carrier's own pull does not count."""
    facts = EventFacts()
    facts.on_sync(
        [
            ev(
                "Scheduled",
                "Successfully assigned ns/p to n",
                at=0,
                eventTime="2026-01-01T00:00:00.250000Z",
                firstTimestamp=None,
            ),
            ev(
                "Pulled", 'Container image "carrier" already present on machine', at=1, path=CARRIER
            ),
            ev("Pulling", 'Pulling image "task"', at=1, path=MAIN),
            ev(
                "Pulled",
                'Successfully pulled image "task" in 1.5s (2.5s including waiting). '
                "Image size: 43000000 bytes.",
                at=4,
                path=MAIN,
            ),
            ev("Started", "Started container sandbox", at=5, path=MAIN),
        ]
    )
    info = facts.join(ReadyInfo(address="a:1", timeline={}), "u1")
    assert (info.image_present, info.pull_ms, info.address_failures) == (False, 2500.0, 0)
    assert list(info.timeline) == ["scheduled", "address_assigned", "image_pulled", "started"]
    assert info.timeline["scheduled"].microsecond == 250000
    assert info.timeline["image_pulled"] == dt.datetime(2026, 1, 1, 0, 0, 4, tzinfo=dt.UTC)


def test_address_failures_sum_the_latest_count_of_each_aggregated_event() -> None:
    """client-go's correlator bumps ``count`` on one Event (watch: MODIFIED) and combines
    similar ones: the total is the latest count of each distinct Event, summed."""
    facts = EventFacts()
    msg = "Failed to create pod sandbox: ... failed to assign an IP address to container"
    facts.on_event("ADDED", ev("Scheduled", "Successfully assigned ns/p to n", at=0))
    facts.on_event("ADDED", ev("FailedCreatePodSandBox", msg, at=1, name="a"))
    facts.on_event("MODIFIED", ev("FailedCreatePodSandBox", msg, at=1, name="a", count=3))
    facts.on_event(
        "ADDED",
        ev(
            "FailedCreatePodSandBox",
            "(combined from similar events): " + msg,
            at=2,
            name="b",
            count=2,
        ),
    )
    facts.on_event("ADDED", ev("FailedCreatePodSandBox", "some other sandbox error", at=2))
    facts.on_event("DELETED", ev("FailedCreatePodSandBox", msg, at=1, name="a", count=3))
    info = facts.join(ReadyInfo(address="a:1"), "u1")
    assert info.address_failures == 5


def test_without_events_pulls_and_address_failures_are_unknown_not_zero() -> None:
    facts = EventFacts()
    assert facts.join(ReadyInfo(address="a:1"), "u1").address_failures is None
    # Seen starting but not its Scheduled Event (expired): the count is not known either.
    facts.on_event("ADDED", ev("Started", "Started container sandbox", at=5, path=MAIN))
    info = facts.join(ReadyInfo(address="a:1"), "u1")
    assert (info.image_present, info.pull_ms, info.address_failures) == (None, None, None)
