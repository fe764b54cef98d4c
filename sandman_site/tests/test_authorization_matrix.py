"""Authorization matrix (issue 12 item 2): every operation of the OpenAPI document x
{no token, a bad token, another trainer's token, a staff user, the owner}.

The operations come from the document itself, so an endpoint added later is in the
matrix without editing this file. The rule (docs/architecture.md §5):

* no token / a bad token: 401 everywhere;
* objects a trainer owns (a path naming a job, a sandbox or a grading): the owner and
  staff get past authorization; another trainer gets 404 (the same sentence as an id
  that does not exist, so existence never leaks);
* incident writes are staff-only: a trainer gets 403;
* the shared catalogue (tasks, task sets, incident reads) and the collections: any
  trainer; a collection lists only the caller's own objects (staff: everyone's).

"Gets past authorization" means any answer but 401/403/404 (an empty ``{}`` body is
then usually a 400 of the view's validation). No answer, and no log line, carries any
principal's API token; neither do the admin's pages.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

import pytest

from sandboxes.tests.api_support import api, make_job, make_user, seed_sandbox

pytestmark = pytest.mark.django_db

OWNED = ("{job_id}", "{sandbox_id}", "{grading_id}", "{certification_id}")
STAFF_WRITES = {
    ("POST", "/api/v1/incidents/"),
    ("PATCH", "/api/v1/incidents/{incident_id}/"),
    ("POST", "/api/v1/incidents/import/"),
}
DENIED = (401, 403, 404)


@pytest.fixture
def world() -> dict[str, Any]:
    from grading.tests.support import instance
    from incidents.tests.conftest import case_body

    owner, owner_token = make_user("owner")
    _, other_token = make_user("other")
    _, staff_token = make_user("staff", staff=True)
    job = make_job(owner, name="owned")
    sandbox = seed_sandbox(job, hand_out=True)
    staff = api(staff_token)
    task = staff.post("/api/v1/tasks/", instance(), format="json")
    assert task.status_code == 201, task.content
    task_id = task.json()["instance_id"]
    task_set = staff.post("/api/v1/task-sets/", {"name": "s", "tasks": [task_id]}, format="json")
    assert task_set.status_code == 201, task_set.content
    incident = staff.post("/api/v1/incidents/", case_body(), format="json")
    assert incident.status_code == 201, incident.content
    return {
        "tokens": {"owner": owner_token, "other": other_token, "staff": staff_token},
        "ids": {
            "job_id": job.pk,
            "sandbox_id": sandbox.pk,
            "grading_id": _grading_id(job, task_id),
            "task_set_id": task_set.json()["id"],
            "certification_id": _certification_id(job, task_set.json()["id"]),
            "instance_id": task_id,
            "incident_id": incident.json()["id"],
        },
        "owned": {"job": job.pk, "sandbox": sandbox.pk},
    }


def _certification_id(job: Any, task_set_id: int) -> int:
    """A running certification of the owner's job (a row: only its visibility matters)."""
    from django.utils import timezone

    from grading.models import Certification

    now = timezone.now()
    certification = Certification.objects.create(
        task_set_id=task_set_id,
        job=job,
        config={},
        config_hash="0" * 64,
        created_by=job.owner,
        created_at=now,
        state_changed_at=now,
    )
    return certification.pk


def _grading_id(job: Any, instance_id: str) -> int:
    """A queued grading of the owner's job (a row: only its visibility matters here)."""
    from django.utils import timezone

    from grading.models import Grading, Task

    now = timezone.now()
    grading = Grading.objects.create(
        job=job,
        task=Task.objects.get(instance_id=instance_id),
        patch_sha256="0" * 64,
        suites=[],
        created_by=job.owner,
        created_at=now,
        state_changed_at=now,
    )
    return grading.pk


def _operations() -> list[tuple[str, str]]:
    _, token = make_user("schema-reader-matrix")
    schema = json.loads(
        api(token).get("/api/v1/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").content
    )
    return [(method.upper(), path) for path, ops in schema["paths"].items() for method in ops]


def _call(client: Any, method: str, path: str) -> Any:
    if method == "GET":
        return client.get(path)
    return client.generic(method, path, "{}", content_type="application/json")


def _expected(principal: str, method: str, template: str) -> str:
    """'pass' (gets past authorization), or the one status the principal must get."""
    if principal in ("none", "bad"):
        return "401"
    owned = any(part in template for part in OWNED)
    if (method, template) in STAFF_WRITES:
        return "pass" if principal == "staff" else "403"
    if owned and principal == "other":
        return "404"
    return "pass"


def test_every_operation_admits_only_the_owner_and_staff(
    world: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    from sandboxes.apis import access

    caplog.set_level(logging.DEBUG)
    tokens = world["tokens"]
    principals = {
        "none": None,
        "bad": "0" * 40,
        "other": tokens["other"],
        "staff": tokens["staff"],
        "owner": tokens["owner"],
    }
    operations = _operations()
    assert len(operations) >= 28
    wrong: list[str] = []
    answers: list[bytes] = []
    for method, template in operations:
        path = template.format(**world["ids"])
        for principal, token in principals.items():
            access.clear()  # every principal authenticates afresh (no shared cache)
            response = _call(api(token), method, path)
            answers.append(response.content)
            want = _expected(principal, method, template)
            got = response.status_code
            ok = got not in DENIED if want == "pass" else str(got) == want
            if not ok:
                wrong.append(f"{principal:5} {method} {template}: {got} (want {want})")
            if got >= 400:
                assert response.json()["error"], (principal, method, template)
    assert wrong == []
    _assert_no_token_in(answers, caplog.text, tokens)


def test_collections_list_only_the_callers_objects(world: dict[str, Any]) -> None:
    tokens, owned = world["tokens"], world["owned"]
    for path, key in (("/api/v1/jobs/", "job"), ("/api/v1/sandboxes/", "sandbox")):
        seen = {
            who: [row["id"] for row in api(tokens[who]).get(path).json()["results"]]
            for who in ("owner", "other", "staff")
        }
        assert owned[key] in seen["owner"] and owned[key] in seen["staff"], path
        assert seen["other"] == [], path


def test_no_token_appears_in_the_admin(world: dict[str, Any]) -> None:
    from django.contrib.auth import get_user_model
    from django.test import Client

    admin = get_user_model().objects.create_superuser("root", password="pw")
    client = Client()
    client.force_login(admin)
    pages = [
        "/admin/",
        "/admin/authtoken/tokenproxy/",
        "/admin/sandboxes/job/",
        "/admin/sandboxes/sandbox/",
        f"/admin/sandboxes/sandbox/{world['owned']['sandbox']}/change/",
        "/admin/auth/user/",
    ]
    bodies = []
    for page in pages:
        response = client.get(page)
        assert response.status_code == 200, page
        bodies.append(response.content)
    _assert_no_token_in(bodies, "", world["tokens"])


def _assert_no_token_in(bodies: list[bytes], log: str, tokens: dict[str, str]) -> None:
    for who, key in tokens.items():
        assert key not in log, f"{who}'s token in the log"
        pattern = re.compile(re.escape(key.encode()))
        assert not any(pattern.search(body) for body in bodies), f"{who}'s token in an answer"
