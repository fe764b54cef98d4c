"""Free pod addresses per subnet, and the floor below which the pool stops creating.

On a VPC-CNI cluster every pod takes an address of its node's subnet, so free addresses,
not CPU, end a burst: the paper stopped at 12,000 sandboxes when the free addresses fell
from 33.6k to 26.5k (§5.2). The controller reads the subnets (:class:`SubnetSource`, EC2
``DescribeSubnets``' document: ``{"Subnets": [{"SubnetId", "AvailabilityZone",
"AvailableIpAddressCount", ...}]}``) every few seconds and hands them to
:class:`AddressFloor`; while any subnet has fewer free addresses than the floor the gate is
*closed*: no new create is admitted and every create still waiting for its pacer token
fails with ``address_floor`` (503), which its waiting acquire answers. Warm pods (they hold
their addresses) are still handed out.

Pure except :class:`UrlSubnetSource` (one GET of a URL: ``http(s)://`` or ``file://``, e.g.
the output of ``aws ec2 describe-subnets`` a sidecar refreshes). Rules a reader must not
break: a floor of 0 or no reading never closes the gate; a failed reading keeps the last
state (an unreadable source neither opens nor closes it).
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from sandman_site.errors import SandmanError

T = TypeVar("T")


class AddressFloorReached(SandmanError):
    """A subnet's free pod addresses are under the floor: the pool creates nothing."""

    code = "address_floor"
    status = 503


@dataclass(frozen=True)
class SubnetFree:
    subnet_id: str
    zone: str
    available: int
    cidr: str = ""


def parse_describe_subnets(doc: Mapping[str, Any]) -> list[SubnetFree]:
    """The subnets of a ``DescribeSubnets`` answer; ValueError on any other shape."""
    items = doc.get("Subnets") if isinstance(doc, Mapping) else None
    if not isinstance(items, list):
        raise ValueError("not a DescribeSubnets document: no Subnets list")
    out = []
    for item in items:
        if not isinstance(item, Mapping):
            raise ValueError("a Subnets entry is not an object")
        count = item.get("AvailableIpAddressCount")
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise ValueError(f"{item.get('SubnetId')!r}: AvailableIpAddressCount is not a count")
        out.append(
            SubnetFree(
                subnet_id=str(item.get("SubnetId", "")),
                zone=str(item.get("AvailabilityZone", "")),
                available=count,
                cidr=str(item.get("CidrBlock", "")),
            )
        )
    return out


class SubnetSource(Protocol):
    def subnets(self) -> list[SubnetFree]:
        """The subnets the sandbox nodes use, now (blocking; run off the loop)."""
        ...


class UrlSubnetSource:
    """Reads a ``DescribeSubnets`` document from a URL (``http(s)://`` or ``file://``)."""

    def __init__(self, url: str, *, timeout_s: float = 5.0) -> None:
        if not url.startswith(("http://", "https://", "file://")):
            raise ValueError("SANDMAN_SUBNETS_URL must be an http(s):// or file:// URL")
        self.url, self.timeout_s = url, timeout_s

    def subnets(self) -> list[SubnetFree]:
        with urllib.request.urlopen(self.url, timeout=self.timeout_s) as answer:  # noqa: S310
            return parse_describe_subnets(json.loads(answer.read()))


@dataclass(frozen=True)
class FloorChange:
    """The gate closed (``closed``) or opened again, and on which reading."""

    closed: bool
    low: SubnetFree | None
    floor: int
    subnets: tuple[SubnetFree, ...]


class AddressFloor:
    """The gate: open while every subnet has at least ``floor`` free addresses."""

    def __init__(self, floor: int = 0) -> None:
        if floor < 0:
            raise ValueError("the address floor is a count of addresses, 0 or more")
        self.floor = floor
        self.subnets: tuple[SubnetFree, ...] = ()
        self.low: SubnetFree | None = None  # the subnet under the floor, while closed
        self._last_low: SubnetFree | None = None  # the latest closing's (a quick reopen)
        self._closed_event: asyncio.Event | None = None

    @property
    def closed(self) -> bool:
        return self.low is not None

    def observe(self, subnets: list[SubnetFree]) -> FloorChange | None:
        """Take a reading; the change it made (closed or reopened), else None."""
        self.subnets = tuple(subnets)
        under = [s for s in subnets if s.available < self.floor] if self.floor else []
        low = min(under, key=lambda s: (s.available, s.subnet_id)) if under else None
        was_closed = self.closed
        self.low = low
        if low is not None:
            self._last_low = low
        if low is not None and self._closed_event is not None:
            self._closed_event.set()
        if low is None and self._closed_event is not None:
            self._closed_event = None  # a new event for the next closing
        if was_closed == self.closed:
            return None
        return FloorChange(closed=self.closed, low=low, floor=self.floor, subnets=self.subnets)

    def refusal(self, *, latest: bool = False) -> AddressFloorReached | None:
        """The refusal while closed (``latest``: also of the latest closing, if reopened)."""
        low = self.low or (self._last_low if latest else None)
        if low is None:
            return None
        return AddressFloorReached(
            f"subnet {low.subnet_id} ({low.zone}) has {low.available} free pod addresses, "
            f"under the floor of {self.floor}: the pool creates no sandbox until it recovers "
            "(warm sandboxes are still handed out)",
            {"subnet": low.subnet_id, "available": low.available, "floor": self.floor},
        )

    def check(self) -> None:
        """Raise ``AddressFloorReached`` while the gate is closed."""
        refused = self.refusal()
        if refused is not None:
            raise refused

    async def while_open(self, work: Awaitable[T]) -> T:
        """``work``'s result, or ``AddressFloorReached`` (``work`` cancelled) if the gate
        closes first. Loop thread only."""
        self.check()
        if not self.floor:
            return await work
        if self._closed_event is None:
            self._closed_event = asyncio.Event()
        task = asyncio.ensure_future(work)
        closed = asyncio.ensure_future(self._closed_event.wait())
        try:
            await asyncio.wait({task, closed}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            task.cancel()  # the caller gave up: so does the work (the pacer gives back)
            raise
        finally:
            closed.cancel()
        if task.done():
            return task.result()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        refused = self.refusal(latest=True)
        assert refused is not None  # the event is set only on a closing reading
        raise refused

    def snapshot(self) -> dict[str, Any]:
        return {
            "floor": self.floor,
            "closed": self.closed,
            "subnets": [
                {"subnet": s.subnet_id, "zone": s.zone, "available": s.available}
                for s in self.subnets
            ],
        }
