"""The live dashboard in headless Chromium against the real ASGI app (Daphne, in-process).

An operator logs in through the admin login form and the page draws every chart with the
locally served Plotly. Then a trainer acquires a sandbox through the REST API of the same
server: the real controller (``controller`` fixture: its own loop thread, the local
provider, a real execd process) creates it, the pool's services record requested →
creating → Ready → in use and the finished acquisition, and each publishes after its
commit. The page must gain a point on the create-to-Ready and acquisition-wait charts
over the websocket, without a reload. Waits are on page state (``wait_for_function``).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone
from rest_framework.authtoken.models import Token

from dashboards.pages.overview import CHARTS
from dashboards.tests.factories import job_through_services, ready_through_services
from sandboxes.services import sandbox_transition
from sandboxes.states import SandboxState
from sandboxes.tests.http_support import post_json

pytestmark = pytest.mark.browser

SCREENSHOT = "/tmp/dashboard.png"


def _points(chart: str, trace: int = 0) -> str:
    return f"document.getElementById('chart-{chart}').data[{trace}].x.length"


@pytest.fixture
def history(transactional_db: None) -> dict[str, Any]:
    """Before the controller starts: an operator, a trainer with a token, and a job whose
    three earlier sandboxes were Ready 10 and 5 minutes ago and have been deleted since."""
    get_user_model().objects.create_user(username="operator", password="pw-op", is_staff=True)
    trainer = get_user_model().objects.create_user(username="trainer", password="pw-tr")
    job = job_through_services("campaign-a", trainer)
    job.egress = "allow"  # the local sandbox needs no network namespace for this test
    job.save(update_fields=["egress"])
    now = timezone.now()
    for minutes_ago, took_ms, present in [(10, 4200, True), (10, 9800, False), (5, 2100, True)]:
        ready_at = now - dt.timedelta(minutes=minutes_ago)
        row = ready_through_services(
            job,
            requested_at=ready_at - dt.timedelta(milliseconds=took_ms),
            ready_at=ready_at,
            image_present=present,
        )
        for to in (SandboxState.DELETING, SandboxState.DELETED):
            sandbox_transition(sandbox_id=row.pk, to=to, now=ready_at + dt.timedelta(seconds=30))
    return {"job_id": job.pk, "token": Token.objects.create(user=trainer).key}


def _log_in(page: Any, live_url: str) -> None:
    page.goto(f"{live_url}/")
    assert "/admin/login/" in page.url  # staff only: anonymous visitors are sent to log in
    page.fill("#id_username", "operator")
    page.fill("#id_password", "pw-op")
    page.click("input[type=submit]")
    page.wait_for_url(f"{live_url}/")


def _acquire(live_url: str, history: dict[str, Any]) -> dict[str, Any]:
    body = {"image": "sandman/empty", "spec": {"cpu": "500m", "memory": "256Mi"}, "timeout_s": 60}
    return post_json(
        f"{live_url}/api/v1/jobs/{history['job_id']}/acquire/",
        body,
        headers={"Authorization": f"Token {history['token']}"},
        timeout_s=90,
    )


def test_an_acquired_sandbox_adds_points_to_the_open_dashboard_without_reload(
    history: dict[str, Any], controller: Any, browser_page: Any, live_url: str
) -> None:
    page = browser_page
    _log_in(page, live_url)
    page.wait_for_function(
        "document.body.dataset.drawn === 'yes' && document.body.dataset.ws === 'open'"
    )
    assert page.locator(".js-plotly-plot").count() == len(CHARTS)
    assert page.evaluate(_points("ready_time")) == 2  # one-minute buckets, 10 and 5 min ago
    assert page.evaluate(_points("acquire_wait")) == 0
    page.evaluate("window.__sameDocument = true")

    got = _acquire(live_url, history)
    assert got["source"] == "created"

    page.wait_for_function(f"{_points('ready_time')} === 3 && {_points('acquire_wait')} === 1")
    assert page.evaluate("window.__sameDocument") is True
    events = page.evaluate("window.sandmanDashboard.lastEvents")
    states = [
        e["payload"]["state"]
        for e in events
        if e["kind"] == "sandbox.state" and e["payload"].get("sandbox_id") == got["sandbox_id"]
    ]
    assert states[:3] == ["requested", "creating", "ready"]
    assert any(
        e["kind"] == "acquisition" and e["payload"].get("sandbox_id") == got["sandbox_id"]
        for e in events
    )
    refreshes = page.evaluate("window.sandmanDashboard.refreshes")
    assert refreshes["ready_time"]["lastReason"] == "event:sandbox.state"
    assert refreshes["acquire_wait"]["lastReason"] == "event:acquisition"
    # The data table beside the chart shows the new bucket as well.
    assert page.locator("#table-ready_time tbody tr").count() == 3
    # The in-use bar (fourth state) counts the sandbox the trainer now holds.
    page.wait_for_function("document.getElementById('chart-states').data[0].y[3] === 1")

    page.screenshot(path=SCREENSHOT, full_page=True)
    assert page.errors == []  # type: ignore[attr-defined]
