"""Writes for the address gauge: subnet readings and the floor's changes (one transaction).

The controller's address watch (``sandboxes.controller.addresswatch``) calls
:func:`subnet_samples_record` after every reading; a change of the gate (closed / opened)
is written with the same reading and published to the dashboards after commit, so an
operator sees the moment the pool stopped creating and why.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from django.db import transaction

from sandboxes.addresses import FloorChange, SubnetFree
from sandboxes.models import AddressFloorChange, SubnetSample
from sandboxes.services._publish import publish_on_commit


def subnet_samples_record(
    *,
    subnets: Sequence[SubnetFree],
    floor: int,
    change: FloorChange | None,
    now: dt.datetime,
) -> int:
    """Store one reading of every subnet (and the gate's change, if any); returns rows."""
    with transaction.atomic():
        SubnetSample.objects.bulk_create(
            [
                SubnetSample(
                    at=now,
                    subnet_id=s.subnet_id[:64],
                    zone=s.zone[:64],
                    available=s.available,
                    floor=floor,
                )
                for s in subnets
            ]
        )
        if change is not None:
            low = change.low
            AddressFloorChange.objects.create(
                at=now,
                closed=change.closed,
                subnet_id=(low.subnet_id if low else "")[:64],
                available=low.available if low else 0,
                floor=change.floor,
            )
            publish_on_commit(
                "address.floor",
                {
                    "closed": change.closed,
                    "subnet": low.subnet_id if low else "",
                    "available": low.available if low else None,
                    "floor": change.floor,
                    "at": now,
                },
            )
    return len(subnets)
