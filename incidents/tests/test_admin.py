"""The incidents admin, driven through the Django test client as a logged-in operator."""

from __future__ import annotations

import csv
import io
from typing import Any

import pytest
from django.core.management import call_command
from django.test import Client

from incidents.models import Incident

from .conftest import T0

pytestmark = pytest.mark.django_db
CHANGELIST = "/admin/incidents/incident/"


@pytest.fixture
def operator(staff_user: Any) -> Client:
    client = Client()
    client.force_login(staff_user)
    return client


@pytest.fixture
def paper_cases(db: Any) -> None:
    call_command("loaddata", "paper_cases", verbosity=0)


def shown(response: Any) -> set[str]:
    assert response.status_code == 200
    return {str(obj) for obj in response.context["cl"].result_list}


def test_the_changelist_filters_on_stage_class_evidence_status_and_account(
    operator: Client, paper_cases: None
) -> None:
    everything = shown(operator.get(CHANGELIST))
    assert len(everything) == Incident.objects.count() == 16

    outside = shown(operator.get(CHANGELIST, {"stage__exact": "outside"}))
    assert outside == {
        "Node-group rolling updates under running jobs",
        "Fleet-wide stall in the extension",
    }
    combined = shown(operator.get(CHANGELIST, {"cause": "implementation+kubernetes_default"}))
    assert combined == {"Service environment injection slowed every shell"}
    involves_cluster = shown(operator.get(CHANGELIST, {"cause": "has:cluster_service"}))
    assert "Unauthenticated inbound access to sandboxes" in involves_cluster
    assert "Admission webhook collapse" in involves_cluster
    reproductions = shown(operator.get(CHANGELIST, {"evidence_kind__exact": "reproduction"}))
    assert reproductions == {
        "Commands that never returned",
        "Planted test file passed a non-fix",
        "Sandbox reset deleted the task repository",
    }
    assert shown(operator.get(CHANGELIST, {"status__exact": "wont_fix"})) == {
        "Node-group rolling updates under running jobs"
    }
    assert len(shown(operator.get(CHANGELIST, {"account": "yes"}))) == 10
    assert len(shown(operator.get(CHANGELIST, {"gpu_hours_basis__exact": "stall"}))) == 3


def test_search_covers_the_text_fields_and_the_date_hierarchy_narrows(
    operator: Client, paper_cases: None
) -> None:
    # "heredoc" appears only in what happened / verified texts, not in a title.
    assert shown(operator.get(CHANGELIST, {"q": "heredoc"})) == {"Commands that never returned"}
    assert shown(operator.get(CHANGELIST, {"q": "disruption budget"})) == {
        "Admission webhook collapse"
    }
    july = shown(operator.get(CHANGELIST, {"started_at__year": 2026, "started_at__month": 7}))
    assert july == {
        "Planted test file passed a non-fix",
        "Sandbox reset deleted the task repository",
    }


def test_the_csv_action_exports_the_selected_incidents(operator: Client, paper_cases: None) -> None:
    chosen = Incident.objects.filter(stage="outside")
    response = operator.post(
        CHANGELIST,
        {
            "action": "export_csv",
            "_selected_action": [str(pk) for pk in chosen.values_list("pk", flat=True)],
        },
    )
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/csv")
    assert "attachment" in response["Content-Disposition"]
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    assert sorted(r["title"] for r in rows) == sorted(chosen.values_list("title", flat=True))
    rolling = next(r for r in rows if r["title"].startswith("Node-group"))
    assert rolling["root_cause_class"] == "cluster or shared service"
    assert (rolling["gpu_hours_low"], rolling["gpu_hours_high"]) == ("1309.0", "1309.0")
    assert rolling["gpu_hours_basis"] == "lifetime"


def test_the_detail_form_shows_the_papers_columns_and_read_only_audit_fields(
    operator: Client, paper_cases: None
) -> None:
    incident = Incident.objects.get(title="Admission webhook collapse")
    page = operator.get(f"{CHANGELIST}{incident.pk}/change/").content.decode()
    for heading in ("What happened", "Cause", "Fix", "Effect", "Links", "Audit"):
        assert f">{heading}<" in page
    assert 'name="recorded_at"' not in page  # read-only, shown as text
    assert 'name="gpu_hours_low"' in page


def form_data(**overrides: Any) -> dict[str, Any]:
    data = {
        "title": "Pool not drained at job end",
        "started_at_0": "2026-10-19",
        "started_at_1": "10:00:00",
        "ended_at_0": "",
        "ended_at_1": "",
        "stage": "cleanup",
        "workload": "check run",
        "status": "open",
        "what_happened": "The detached pool actor got no drain call; its pods stayed.",
        "how_found": "",
        "cause": "",
        "trigger": "",
        "fix": "",
        "how_verified": "",
        "evidence_kind": "production",
        "effect": "18 pods for about 10 minutes.",
        "gpu_hours_low": "",
        "gpu_hours_high": "",
        "gpu_hours_basis": "",
        "cause_in_implementation": "on",
        "jobs": "",
        "sandboxes": "",
    }
    data.update(overrides)
    return data


def test_adding_in_the_admin_stamps_who_recorded_it_and_when(
    operator: Client, staff_user: Any
) -> None:
    response = operator.post(f"{CHANGELIST}add/", form_data())
    assert response.status_code == 302, response.context["adminform"].form.errors
    incident = Incident.objects.get()
    assert incident.recorded_by == staff_user
    assert incident.recorded_at is not None and incident.recorded_at > T0
    assert incident.cause_class_label == "sandbox implementation"


@pytest.mark.parametrize(
    ("overrides", "field", "message"),
    [
        (
            {"gpu_hours_low": "200", "gpu_hours_high": "100", "gpu_hours_basis": "stall"},
            "gpu_hours_low",
            "above the upper bound",
        ),
        ({"gpu_hours_low": "10", "gpu_hours_high": "20"}, "gpu_hours_basis", "needs a basis"),
        ({"gpu_hours_basis": "lifetime"}, "gpu_hours_low", "needs both"),
        ({"ended_at_0": "2026-10-18", "ended_at_1": "10:00:00"}, "ended_at", "before the start"),
    ],
)
def test_the_admin_form_explains_invalid_records_and_saves_nothing(
    operator: Client, overrides: dict, field: str, message: str
) -> None:
    response = operator.post(f"{CHANGELIST}add/", form_data(**overrides))
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert message in " ".join(errors[field])
    assert not Incident.objects.exists()


def test_the_admin_refuses_a_status_move_outside_the_map(
    operator: Client, paper_cases: None
) -> None:
    incident = Incident.objects.get(title="Node-group rolling updates under running jobs")
    data = form_data(
        title=incident.title,
        stage=incident.stage,
        status="fixed",
        started_at_0="2026-10-18",
        started_at_1="00:00:00",
        gpu_hours_low="1309",
        gpu_hours_high="1309",
        gpu_hours_basis="lifetime",
    )
    response = operator.post(f"{CHANGELIST}{incident.pk}/change/", data)
    assert response.status_code == 200
    assert "reopen it first" in " ".join(response.context["adminform"].form.errors["status"])
    incident.refresh_from_db()
    assert incident.status == "wont_fix"
