"""Reads for the free-address chart: per-subnet minimum per bucket, and the floor changes.

Aggregated in the database (one grouped query each), never a loop over readings.
"""

from __future__ import annotations

from django.db.models import F, Max, Min

from dashboards.filters import ChartFilter
from dashboards.rows.addresses import FloorChangeRow, SubnetFreeBucket
from dashboards.sql import EpochMs, FloorDiv
from dashboards.window import bucket_start
from sandboxes.models import AddressFloorChange, SubnetSample


def subnet_free_per_bucket(flt: ChartFilter) -> list[SubnetFreeBucket]:
    window = flt.window
    bucket_s = int(window.bucket_s)
    rows = (
        SubnetSample.objects.filter(at__gte=window.since, at__lt=window.until)
        .annotate(op_bucket=FloorDiv(EpochMs(F("at")), bucket_s * 1000))
        .values("op_bucket", "subnet_id", "zone")
        .annotate(op_min=Min("available"), op_floor=Max("floor"))
        .order_by("subnet_id", "op_bucket")
        .values_list("op_bucket", "subnet_id", "zone", "op_min", "op_floor")
    )
    return [
        SubnetFreeBucket(
            bucket_start=bucket_start(bucket, bucket_s),
            bucket_s=bucket_s,
            subnet_id=subnet,
            zone=zone,
            min_available=int(low),
            floor=int(floor),
        )
        for bucket, subnet, zone, low, floor in rows
    ]


def floor_changes(flt: ChartFilter) -> list[FloorChangeRow]:
    window = flt.window
    return [
        FloorChangeRow(
            at=c.at, closed=c.closed, subnet_id=c.subnet_id, available=c.available, floor=c.floor
        )
        for c in AddressFloorChange.objects.filter(
            at__gte=window.since, at__lt=window.until
        ).order_by("at", "id")
    ]
