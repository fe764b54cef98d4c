"""``incidents_export`` / ``incidents_import`` management commands on real files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from incidents.models import Incident

pytestmark = pytest.mark.django_db


def test_export_and_import_round_trip_through_a_file(tmp_path: Path) -> None:
    call_command("loaddata", "paper_cases", verbosity=0)
    target = tmp_path / "incidents.json"
    call_command("incidents_export", str(target))
    document = json.loads(target.read_text())
    assert len(document["incidents"]) == 16

    Incident.objects.all().delete()
    call_command("incidents_import", str(target))
    assert Incident.objects.count() == 16
    webhook = Incident.objects.get(title="Admission webhook collapse")
    assert (webhook.gpu_hours_low, webhook.gpu_hours_high) == (973, 1145)
    assert webhook.cause_class_label == "cluster or shared service"


def test_an_import_file_with_a_bad_record_imports_nothing(tmp_path: Path) -> None:
    call_command("loaddata", "paper_cases", verbosity=0)
    target = tmp_path / "incidents.json"
    call_command("incidents_export", str(target))
    document = json.loads(target.read_text())
    Incident.objects.all().delete()
    document["incidents"][5]["ended_at"] = "2000-01-01T00:00:00Z"
    target.write_text(json.dumps(document))

    with pytest.raises(CommandError, match="Record 5: ended_at"):
        call_command("incidents_import", str(target))
    assert not Incident.objects.exists()

    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(CommandError, match="cannot read"):
        call_command("incidents_import", str(tmp_path / "broken.json"))
