"""Detector ``address_floor``: a draft incident for every time the pool stopped creating
because a subnet's free pod addresses fell under the floor (``sandboxes.addresses``).

One case per closing of the gate (window ``closed:<time>``), so re-running never opens it
twice; it links the jobs whose acquires were refused with ``address_floor`` between the
closing and the next opening (or now) and says how many were refused.
"""

from __future__ import annotations

from datetime import datetime

from django.conf import settings
from django.db.models import Count
from django.db.models.functions import Coalesce

from incidents import services
from incidents.models import Incident
from incidents.services import Draft
from incidents.states import Stage
from sandboxes.models import Acquisition, AddressFloorChange
from sandboxes.states import AcquisitionOutcome

ADDRESS_FLOOR = "address_floor"


def detect_address_floor(*, since: datetime, now: datetime) -> list[Incident]:
    opened: list[Incident] = []
    closings = AddressFloorChange.objects.filter(closed=True, at__gte=since, at__lte=now)
    for closing in closings.order_by("at", "id"):
        window = f"closed:{closing.at.isoformat()}"
        if Incident.objects.filter(detector_key=ADDRESS_FLOOR, detector_window=window).exists():
            continue
        reopened = (
            AddressFloorChange.objects.filter(closed=False, at__gte=closing.at)
            .order_by("at", "id")
            .first()
        )
        until = reopened.at if reopened is not None else now
        refused = (
            # By when they ended: an acquire waiting when the gate closed is refused too.
            Acquisition.objects.filter(outcome=AcquisitionOutcome.ADDRESS_FLOOR)
            .annotate(ended=Coalesce("finished_at", "started_at"))
            .filter(ended__gte=closing.at, ended__lte=until)
            .values("job")
            .annotate(n=Count("id"))
            .order_by("job")
        )
        per_job = {row["job"]: row["n"] for row in refused}
        total = sum(per_job.values())
        draft = Draft(
            key=ADDRESS_FLOOR,
            window=window,
            title=f"Creates stopped at the address floor from {closing.at:%Y-%m-%d %H:%M} UTC",
            stage=Stage.SERVICE_ADMISSION,
            what_happened=(
                f"Subnet {closing.subnet_id} had {closing.available} free pod addresses, "
                f"under the floor of {closing.floor}: the pool stopped creating"
                + (
                    f" until {reopened.at:%Y-%m-%d %H:%M} UTC."
                    if reopened is not None
                    else " and had not resumed when this draft opened."
                )
            ),
            how_found="Detector address_floor over the address gate's recorded changes.",
            effect=f"{total} acquisition(s) refused with address_floor.",
            started_at=closing.at,
            ended_at=reopened.at if reopened is not None else None,
            detail={
                "subnet": closing.subnet_id,
                "available": closing.available,
                "floor": closing.floor,
                "refused_acquisitions": total,
                "refused_by_job": {str(k): v for k, v in per_job.items()},
            },
        )
        incident = services.detector_incident_open(
            draft=draft,
            job_ids=sorted(per_job)[: settings.SANDMAN_DETECT_MAX_LINKED_SANDBOXES],
            sandbox_ids=[],
            now=now,
        )
        if incident is not None:
            opened.append(incident)
    return opened
