"""The address floor: under it the pool creates nothing and every waiting acquire says why.

The paper stopped its scale run at 12,000 sandboxes when the cluster's free pod addresses
fell from 33.6k to 26.5k (§5.2). On a VPC-CNI cluster (Amazon VPC CNI: every pod takes an
address of its node's subnet, docs.aws.amazon.com/eks/latest/userguide/managing-vpc-cni.html)
the free count per subnet is EC2's ``AvailableIpAddressCount``
(docs.aws.amazon.com/AWSEC2/latest/APIReference/API_Subnet.html); the stand-in serves it in
``DescribeSubnets``' document shape (``standin/subnets.py``), read here over real HTTP.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from django.utils import timezone

from incidents.addressfloor import ADDRESS_FLOOR, detect_address_floor
from incidents.models import Incident
from sandboxes import metrics
from sandboxes.addresses import (
    AddressFloor,
    AddressFloorReached,
    SubnetFree,
    UrlSubnetSource,
    parse_describe_subnets,
)
from sandboxes.models import Acquisition, AddressFloorChange, Sandbox, SubnetSample
from sandboxes.tests.controller_support import acquire_args, make_job, wait_until
from standin import StandinCluster
from standin.clock import FakeClock
from standin.harness.support import k8s_provider
from standin.subnets import SubnetSpec

A = SubnetFree("subnet-a", "zone-a", 100)


def test_the_gate_closes_under_the_floor_and_opens_again_at_it() -> None:
    gate = AddressFloor(floor=20)
    assert gate.observe([A]) is None and not gate.closed
    closed = gate.observe([A, SubnetFree("subnet-b", "zone-b", 19)])
    assert closed is not None and closed.closed and closed.low is not None
    assert closed.low.subnet_id == "subnet-b"
    with pytest.raises(AddressFloorReached) as refused:
        gate.check()
    assert refused.value.code == "address_floor" and refused.value.status == 503
    assert "subnet-b" in refused.value.message and "floor of 20" in refused.value.message
    assert gate.observe([A, SubnetFree("subnet-b", "zone-b", 5)]) is None  # still closed
    opened = gate.observe([A, SubnetFree("subnet-b", "zone-b", 20)])
    assert opened is not None and not opened.closed
    gate.check()


def test_no_floor_never_closes_and_a_bad_document_is_refused() -> None:
    gate = AddressFloor(floor=0)
    assert gate.observe([SubnetFree("s", "z", 0)]) is None and not gate.closed
    with pytest.raises(ValueError):
        parse_describe_subnets({"Subnets": [{"SubnetId": "s", "AvailableIpAddressCount": -1}]})
    with pytest.raises(ValueError):
        parse_describe_subnets({"subnets": []})


def test_a_closing_gate_fails_the_work_waiting_under_it() -> None:
    async def run() -> None:
        gate = AddressFloor(floor=10)
        gate.observe([A])
        never: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiting = asyncio.ensure_future(gate.while_open(never))
        await asyncio.sleep(0)  # let it reach its wait
        assert not waiting.done()
        gate.observe([SubnetFree("subnet-a", "zone-a", 3)])
        with pytest.raises(AddressFloorReached):
            await waiting
        assert never.cancelled()  # the pacer wait it held was given up

    asyncio.run(run())


@pytest.fixture
def subnet_cluster() -> Iterator[StandinCluster]:
    # /26: 64 - 5 reserved = 59 usable; two nodes hold 1 + 1 warm each -> 55 free.
    cluster = StandinCluster(
        nodes=2,
        run_execd=True,
        subnets=[SubnetSpec("subnet-a", "10.0.0.0/26", "zone-a")],
        warm_ip_target=1,
    )
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.gates.release_all()
        cluster.run_until_idle(timeout=60)
        cluster.stop()


def test_under_the_floor_creates_stop_waiting_acquires_say_why_and_a_draft_opens(
    make_controller: Any, subnet_cluster: StandinCluster
) -> None:
    clock = FakeClock()
    controller = make_controller(
        provider=k8s_provider(subnet_cluster),
        clock=clock.monotonic,
        sleep=clock.sleep,
        address_source=UrlSubnetSource(f"{subnet_cluster.url}/_standin/subnets"),
        address_floor=20,
        address_poll_s=3600,  # the test reads the subnets itself (poll_addresses)
    )
    job = make_job(rate_per_s=0.2, burst=1)  # one create now, the next 5 s later
    first = controller.acquire(**acquire_args(job))
    assert first.source == "created"
    assert controller.address_gate() == {
        "floor": 20,
        "closed": False,
        "subnets": [{"subnet": "subnet-a", "zone": "zone-a", "available": 55}],
    }

    with ThreadPoolExecutor(max_workers=1) as caller:
        waiting = caller.submit(controller.acquire, **acquire_args(job))
        wait_until(lambda: controller.pacer_queue_length() == 1, what="a create queued")
        # The first pod took a node's warm address, which was topped up: 54 free. Another
        # workload takes 40: 14 free, under the floor of 20.
        assert subnet_cluster.consume_addresses("subnet-a", 40) == 14
        assert controller.poll_addresses()
        with pytest.raises(AddressFloorReached) as said:
            waiting.result(timeout=60)
    assert said.value.code == "address_floor" and "subnet-a" in said.value.message
    rows_before = Sandbox.objects.filter(job=job).count()
    with pytest.raises(AddressFloorReached):
        controller.acquire(**acquire_args(job))  # refused before any row exists
    assert Sandbox.objects.filter(job=job).count() == rows_before
    outcomes = list(
        Acquisition.objects.filter(job=job).order_by("pk").values_list("outcome", flat=True)
    )
    assert outcomes == ["ok", "address_floor", "address_floor"]

    change = AddressFloorChange.objects.get()
    assert (change.closed, change.subnet_id, change.available, change.floor) == (
        True,
        "subnet-a",
        14,
        20,
    )
    assert list(SubnetSample.objects.order_by("at").values_list("available", flat=True)) == [
        55,
        14,
    ]
    text = metrics.render()
    assert 'sandman_subnet_free_addresses{subnet="subnet-a",zone="zone-a"} 14.0' in text
    assert "sandman_address_floor 20.0" in text and "sandman_address_floor_reached 1.0" in text

    (draft,) = detect_address_floor(since=change.at, now=timezone.now())
    assert draft.detector_key == ADDRESS_FLOOR and list(draft.jobs.values_list("pk", flat=True))
    assert "2 acquisition(s) refused" in draft.effect
    assert detect_address_floor(since=change.at, now=timezone.now()) == []
    assert Incident.objects.filter(detector_key=ADDRESS_FLOOR).count() == 1

    # The workload gives the addresses back: creates resume.
    subnet_cluster.consume_addresses("subnet-a", -40)
    assert controller.poll_addresses() and controller.address_gate()["closed"] is False
    controller.loop.call_soon_threadsafe(clock.advance, 5.0)
    again = controller.acquire(**acquire_args(job))
    assert again.source == "created"
    assert list(AddressFloorChange.objects.order_by("at").values_list("closed", flat=True)) == [
        True,
        False,
    ]
