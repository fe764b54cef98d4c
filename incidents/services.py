"""Every write to incident records: create, update, status moves, detector drafts, import.

Rules a caller must not bypass:

* every record passes ``Incident.full_clean()`` (``incidents.rules`` + constraints) before
  it is saved; a failure is an ``InvalidInput`` (400) naming the field, never a 500 and
  never a half-written record (each service is one transaction);
* status changes go through ``incident_set_status`` and the transition map in
  ``incidents.states``; creation and import may start in any status;
* ``recorded_by`` / ``recorded_at`` are stamped here, never taken from an API body
  (import keeps those of the exported record: it restores history);
* a detector window is opened once: ``detector_incident_open`` returns ``None`` when the
  ``(detector_key, detector_window)`` pair exists, even under a concurrent run.

All functions take ``now`` (tz-aware UTC); none reads the clock.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.db import IntegrityError, models, transaction

from incidents.models import Incident, OwnerlessPod
from incidents.records import to_model_fields
from incidents.states import EvidenceKind, IncidentStatus, Stage, transition_allowed
from sandboxes.models import Job, Sandbox
from sandman_site import live
from sandman_site.errors import InvalidInput, InvalidTransition

log = logging.getLogger(__name__)

OWNERLESS_KEY = "ownerless_pods"


def _clean(incident: Incident, *, prefix: str = "") -> None:
    try:
        incident.full_clean()
    except ValidationError as exc:
        fields = exc.message_dict
        sentence = "; ".join(
            f"{name}: {' '.join(messages)}" if name != "__all__" else " ".join(messages)
            for name, messages in fields.items()
        )
        raise InvalidInput(f"{prefix}{sentence}", extra={"fields": fields}) from exc


def _resolve(
    model: type[models.Model], ids: Iterable[int] | None, *, what: str, prefix: str = ""
) -> list:
    if ids is None:
        return []
    wanted = sorted(set(ids))
    found = list(model._default_manager.filter(pk__in=wanted))
    missing = sorted(set(wanted) - {obj.pk for obj in found})
    if missing:
        raise InvalidInput(f"{prefix}unknown {what} ids {missing}.", extra={what: missing})
    return found


def incident_create(
    *,
    data: dict[str, Any],
    recorded_by: Any | None,
    now: datetime,
) -> Incident:
    """Record a case from validated wire data (``incidents.records``)."""
    with transaction.atomic():
        jobs = _resolve(Job, data.get("jobs"), what="job")
        sandboxes = _resolve(Sandbox, data.get("sandboxes"), what="sandbox")
        incident = Incident(**to_model_fields(data))
        incident.recorded_by = recorded_by
        incident.recorded_at = now
        incident.status_changed_at = now
        _clean(incident)
        incident.save()
        incident.jobs.set(jobs)
        incident.sandboxes.set(sandboxes)
    return incident


def incident_update(*, incident_id: int, data: dict[str, Any], now: datetime) -> Incident:
    """Apply the fields present in ``data``; a status change must be a listed move."""
    with transaction.atomic():
        incident = Incident.objects.select_for_update().get(pk=incident_id)
        fields = to_model_fields(data)
        new_status = fields.pop("status", None)
        for name, value in fields.items():
            setattr(incident, name, value)
        if new_status is not None and new_status != incident.status:
            _check_transition(incident.status, new_status)
            incident.status = new_status
            incident.status_changed_at = now
        _clean(incident)
        incident.save()
        if "jobs" in data:
            incident.jobs.set(_resolve(Job, data["jobs"], what="job"))
        if "sandboxes" in data:
            incident.sandboxes.set(_resolve(Sandbox, data["sandboxes"], what="sandbox"))
    return incident


def _check_transition(current: str, target: str) -> None:
    if not transition_allowed(current, target):
        raise InvalidTransition(
            f"An incident cannot move from {current} to {target}.",
            extra={"from": current, "to": target},
        )


def incident_set_status(*, incident: Incident, status: str, now: datetime) -> Incident:
    """The one status transition: checks the map, stamps the time, saves two fields."""
    if status == incident.status:
        return incident
    _check_transition(incident.status, status)
    incident.status = status
    incident.status_changed_at = now
    incident.save(update_fields=["status", "status_changed_at", "updated_at"])
    return incident


# --- detector drafts ----------------------------------------------------------------


@dataclass(frozen=True)
class Draft:
    """What a detector knows about a case it wants opened."""

    key: str
    window: str
    title: str
    stage: str
    what_happened: str
    how_found: str
    effect: str
    started_at: datetime
    ended_at: datetime | None
    detail: dict[str, Any]


def detector_incident_open(
    *,
    draft: Draft,
    job_ids: Sequence[int],
    sandbox_ids: Sequence[int],
    now: datetime,
) -> Incident | None:
    """Open a draft (status open, production evidence) unless its window exists."""
    if Incident.objects.filter(detector_key=draft.key, detector_window=draft.window).exists():
        return None
    incident = Incident(
        title=draft.title[:200],
        started_at=draft.started_at,
        ended_at=draft.ended_at,
        stage=draft.stage,
        what_happened=draft.what_happened,
        how_found=draft.how_found,
        effect=draft.effect,
        evidence_kind=EvidenceKind.PRODUCTION,
        status=IncidentStatus.OPEN,
        status_changed_at=now,
        detector_key=draft.key,
        detector_window=draft.window,
        detector_detail=draft.detail,
        recorded_at=now,
    )
    try:
        with transaction.atomic():
            _clean(incident)
            incident.save()
            incident.jobs.add(*job_ids)
            incident.sandboxes.add(*sandbox_ids)
    except (IntegrityError, InvalidInput):
        # A concurrent run opened the same window between our check and our insert.
        if Incident.objects.filter(detector_key=draft.key, detector_window=draft.window).exists():
            return None
        raise
    _announce(incident)
    return incident


def detector_incident_extend(
    *,
    incident_id: int,
    ended_at: datetime,
    detail: dict[str, Any],
    job_ids: Sequence[int],
    sandbox_ids: Sequence[int],
) -> None:
    """Widen an open detector case to a later part of the same burst (idempotent)."""
    with transaction.atomic():
        incident = Incident.objects.select_for_update().get(pk=incident_id)
        if incident.ended_at is None or ended_at > incident.ended_at:
            incident.ended_at = ended_at
        incident.detector_detail = detail
        incident.save(update_fields=["ended_at", "detector_detail", "updated_at"])
        incident.jobs.add(*job_ids)
        incident.sandboxes.add(*sandbox_ids)


def ownerless_pods_found(*, names: list[str], now: datetime) -> Incident | None:
    """The sweep found labelled pods no live record owns: open one draft for the new ones.

    Pods reported before (by name) are not reported again; ``None`` when nothing is new.
    """
    unique = sorted({name for name in names if name})
    if not unique:
        return None
    known = set(OwnerlessPod.objects.filter(name__in=unique).values_list("name", flat=True))
    new = [name for name in unique if name not in known]
    if not new:
        return None
    digest = hashlib.sha256("\n".join(new).encode()).hexdigest()[:16]
    shown = ", ".join(new[:10]) + (f" and {len(new) - 10} more" if len(new) > 10 else "")
    draft = Draft(
        key=OWNERLESS_KEY,
        window=digest,
        title=f"Ownerless pods found by the sweep: {len(new)}",
        stage=Stage.CLEANUP,
        what_happened=(
            f"The ownership sweep found {len(new)} labelled pod(s) that no live sandbox "
            f"record owns: {shown}. The sweep deletes them."
        ),
        how_found="Ownership sweep (controller).",
        effect=f"{len(new)} pods held without an owner until the sweep.",
        started_at=now,
        ended_at=None,
        detail={"pods": new},
    )
    try:
        with transaction.atomic():
            incident = detector_incident_open(draft=draft, job_ids=[], sandbox_ids=[], now=now)
            if incident is None:
                return None
            OwnerlessPod.objects.bulk_create(
                [OwnerlessPod(name=name, incident=incident, first_seen_at=now) for name in new]
            )
    except IntegrityError:
        # Another sweep reported some of these names at the same moment.
        log.info("ownerless pods %s were reported concurrently", new[:3])
        return None
    return incident


def _announce(incident: Incident) -> None:
    payload = {"id": incident.pk, "title": incident.title, "stage": incident.stage}
    transaction.on_commit(lambda: live.publish("incident_opened", payload))


# --- import -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ImportResult:
    created: int
    updated: int


def incidents_import(
    *, records: list[dict[str, Any]], recorded_by: Any | None, now: datetime
) -> ImportResult:
    """Write validated records (``records.parse_import``) all-or-nothing.

    A record whose ``uid`` exists replaces that record; others are created. Any bad
    record raises ``InvalidInput`` naming its index and nothing is written.
    """
    users = _users_by_name(r.get("recorded_by") for r in records)
    created = updated = 0
    with transaction.atomic():
        for index, data in enumerate(records):
            prefix = f"Record {index}: "
            try:
                was_new = _import_one(data, users, recorded_by, now, prefix)
            except InvalidInput as exc:
                exc.extra["index"] = index
                raise
            created += was_new
            updated += not was_new
    return ImportResult(created=created, updated=updated)


def _users_by_name(names: Iterable[str | None]) -> dict[str, Any]:
    wanted = {n for n in names if n}
    user_model = get_user_model()
    field = user_model.USERNAME_FIELD
    return {getattr(u, field): u for u in user_model.objects.filter(**{f"{field}__in": wanted})}


def _import_one(
    data: dict[str, Any], users: dict[str, Any], importer: Any | None, now: datetime, prefix: str
) -> bool:
    uid = data.get("uid")
    incident = Incident.objects.select_for_update().filter(uid=uid).first() if uid else None
    is_new = incident is None
    if incident is None:
        incident = Incident(uid=uid) if uid else Incident()
    for name, value in to_model_fields(data).items():
        setattr(incident, name, value)
    recorder = data.get("recorded_by")
    incident.recorded_by = users.get(recorder) if recorder else (importer if is_new else None)
    incident.recorded_at = data.get("recorded_at") or incident.recorded_at or now
    incident.status_changed_at = data.get("status_changed_at") or incident.status_changed_at or now
    jobs = _resolve(Job, data.get("jobs", []), what="job", prefix=prefix)
    sandboxes = _resolve(Sandbox, data.get("sandboxes", []), what="sandbox", prefix=prefix)
    _clean(incident, prefix=prefix)
    incident.save()
    incident.jobs.set(jobs)
    incident.sandboxes.set(sandboxes)
    return is_new
