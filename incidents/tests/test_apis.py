"""REST v1 for incidents over the real URL map, with DRF token authentication."""

from __future__ import annotations

import json
from typing import Any

import pytest

from incidents.models import Incident

from .conftest import case_body, make_job, make_sandbox

pytestmark = pytest.mark.django_db
URL = "/api/v1/incidents/"


def test_staff_records_an_incident_and_the_audit_fields_are_stamped(
    staff_api: Any, staff_user: Any
) -> None:
    job = make_job()
    box = make_sandbox(job)
    body = case_body(
        root_cause=["sandbox_implementation", "kubernetes_default"],
        jobs=[job.pk],
        sandboxes=[box.pk],
        recorded_by="someone-else",
        recorded_at="2000-01-01T00:00:00Z",
    )
    response = staff_api.post(URL, body, format="json")

    assert response.status_code == 201, response.json()
    data = response.json()
    assert data["root_cause"] == ["sandbox_implementation", "kubernetes_default"]
    assert data["root_cause_class"] == "implementation and Kubernetes default"
    assert (data["gpu_hours_low"], data["gpu_hours_high"]) == (973.0, 1145.0)
    assert data["jobs"] == [job.pk] and data["sandboxes"] == [box.pk]
    assert data["recorded_by"] == "operator"
    assert not data["recorded_at"].startswith("2000")
    stored = Incident.objects.get(pk=data["id"])
    assert stored.recorded_by == staff_user and stored.cause_in_kubernetes_default


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"gpu_hours_low": 2000}, "gpu_hours_low"),
        ({"gpu_hours_basis": None}, "gpu_hours_basis"),
        ({"gpu_hours_low": None, "gpu_hours_high": None}, "gpu_hours_low"),
        ({"ended_at": "2026-10-14T18:00:00Z"}, "ended_at"),
        ({"stage": "somewhere"}, "stage"),
        ({"root_cause": ["bad luck"]}, "root_cause"),
        ({"gpu_hours_high": -5}, "gpu_hours_high"),
        ({"jobs": [999999]}, "job"),
    ],
)
def test_bad_records_get_a_400_naming_the_field_and_nothing_is_written(
    staff_api: Any, overrides: dict, field: str
) -> None:
    response = staff_api.post(URL, case_body(**overrides), format="json")
    assert response.status_code == 400
    data = response.json()
    assert data["error"] == "invalid"
    assert field in data["detail"]
    assert not Incident.objects.exists()


def test_malformed_json_is_a_400_not_a_500(staff_api: Any) -> None:
    response = staff_api.generic("POST", URL, "{not json", content_type="application/json")
    assert response.status_code == 400
    assert response.json()["error"] == "malformed_json"


def test_non_staff_users_read_but_cannot_write(plain_api: Any, staff_api: Any) -> None:
    created = staff_api.post(URL, case_body(), format="json").json()
    assert plain_api.get(URL).status_code == 200
    assert plain_api.get(f"{URL}{created['id']}/").status_code == 200
    refused = plain_api.post(URL, case_body(title="mine"), format="json")
    assert refused.status_code == 403 and refused.json()["error"] == "forbidden"
    patch = plain_api.patch(f"{URL}{created['id']}/", {"title": "x"}, format="json")
    assert patch.status_code == 403
    imported = plain_api.post(f"{URL}import/", [case_body()], format="json")
    assert imported.status_code == 403
    assert Incident.objects.count() == 1


def test_anonymous_callers_are_refused(client: Any) -> None:
    response = client.get(URL)
    assert response.status_code == 401
    assert response.json()["error"] == "not_authenticated"


def test_list_filters_by_stage_class_account_and_text(staff_api: Any) -> None:
    staff_api.post(URL, case_body(), format="json")
    staff_api.post(
        URL,
        case_body(
            title="Heredoc stall",
            stage="execution",
            root_cause=["sandbox_implementation"],
            gpu_hours_low=None,
            gpu_hours_high=None,
            gpu_hours_basis=None,
            what_happened="An open heredoc made bash wait for input.",
        ),
        format="json",
    )

    def titles(query: str) -> list[str]:
        response = staff_api.get(f"{URL}?{query}")
        assert response.status_code == 200, response.json()
        return [r["title"] for r in response.json()["results"]]

    assert titles("stage=execution") == ["Heredoc stall"]
    assert titles("cause=cluster_service") == ["Admission webhook collapse"]
    assert titles("cause=has:implementation") == ["Heredoc stall"]
    assert titles("has_account=true") == ["Admission webhook collapse"]
    assert titles("q=heredoc") == ["Heredoc stall"]
    bad = staff_api.get(f"{URL}?stage=nowhere")
    assert bad.status_code == 400 and bad.json()["error"] == "invalid"


def test_patch_changes_fields_and_follows_the_status_map(staff_api: Any) -> None:
    created = staff_api.post(URL, case_body(status="open"), format="json").json()
    url = f"{URL}{created['id']}/"

    moved = staff_api.patch(url, {"status": "mitigated", "workload": "evaluation 2"}, format="json")
    assert moved.status_code == 200
    assert moved.json()["status"] == "mitigated" and moved.json()["workload"] == "evaluation 2"
    assert staff_api.patch(url, {"status": "fixed"}, format="json").status_code == 200

    refused = staff_api.patch(url, {"status": "mitigated"}, format="json")
    assert refused.status_code == 409 and refused.json()["error"] == "invalid_transition"

    bad = staff_api.patch(url, {"gpu_hours_low": 5000}, format="json")
    assert bad.status_code == 400 and "gpu_hours_low" in bad.json()["detail"]
    assert Incident.objects.get().gpu_hours_low == 973
    assert staff_api.get(f"{URL}999999/").status_code == 404


def test_export_then_import_restores_every_record(staff_api: Any) -> None:
    staff_api.post(URL, case_body(), format="json")
    staff_api.post(
        URL,
        case_body(title="Second", gpu_hours_basis=None, gpu_hours_low=None, gpu_hours_high=None),
        format="json",
    )
    document = staff_api.get(f"{URL}export/").json()
    assert document["format"] == "sandman-incidents"
    assert [r["title"] for r in document["incidents"]] == ["Admission webhook collapse", "Second"]

    Incident.objects.all().delete()
    response = staff_api.post(f"{URL}import/", document, format="json")
    assert response.status_code == 200, response.json()
    assert response.json() == {"created": 2, "updated": 0}
    again = staff_api.post(f"{URL}import/", document, format="json").json()
    assert again == {"created": 0, "updated": 2}
    restored = staff_api.get(f"{URL}export/").json()["incidents"]
    for before, after in zip(document["incidents"], restored, strict=True):
        for key in ("uid", "title", "root_cause", "gpu_hours_low", "recorded_at", "status"):
            assert before[key] == after[key]


def test_an_import_with_one_bad_record_writes_nothing_and_names_the_record(
    staff_api: Any,
) -> None:
    good = case_body(title="good")
    late_bad = case_body(title="bad bounds", gpu_hours_low=9999)
    response = staff_api.post(
        f"{URL}import/", [good, good | {"title": "ok 2"}, late_bad], format="json"
    )
    assert response.status_code == 400
    assert response.json()["detail"].startswith("Record 2:")
    assert response.json()["extra"]["index"] == 2
    assert not Incident.objects.exists()

    type_bad = staff_api.post(f"{URL}import/", [good, {"title": 5}], format="json")
    assert type_bad.status_code == 400 and type_bad.json()["detail"].startswith("Record 1:")
    assert not Incident.objects.exists()

    not_a_list = staff_api.post(f"{URL}import/", {"incidents": "nope"}, format="json")
    assert not_a_list.status_code == 400


def test_the_accounting_api_sums_bounds_by_class_and_path(staff_api: Any) -> None:
    staff_api.post(URL, case_body(), format="json")
    staff_api.post(
        URL,
        case_body(
            title="rolling update",
            stage="outside",
            gpu_hours_low=1309,
            gpu_hours_high=1309,
            gpu_hours_basis="lifetime",
        ),
        format="json",
    )
    data = staff_api.get(f"{URL}accounting/").json()
    assert data["totals"]["sandbox"] == {"low": 973.0, "high": 1145.0, "cases": 1}
    assert data["totals"]["outside"] == {"low": 1309.0, "high": 1309.0, "cases": 1}
    assert data["totals"]["all"] == {"low": 2282.0, "high": 2454.0, "cases": 2}
    assert [(r["path"], r["label"]) for r in data["by_class"]] == [
        ("sandbox", "cluster or shared service"),
        ("outside", "cluster or shared service"),
    ]


def test_the_openapi_schema_lists_the_incident_operations(plain_api: Any) -> None:
    response = plain_api.get("/api/v1/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert response.status_code == 200
    paths = json.loads(response.content)["paths"]
    assert {"get", "post"} <= set(paths["/api/v1/incidents/"])
    assert {"get", "patch"} <= set(paths["/api/v1/incidents/{incident_id}/"])
    assert "get" in paths["/api/v1/incidents/accounting/"]
    assert "get" in paths["/api/v1/incidents/export/"]
    assert "post" in paths["/api/v1/incidents/import/"]
