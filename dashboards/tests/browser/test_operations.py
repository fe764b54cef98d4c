"""The operations page in headless Chromium against the real ASGI app (Daphne, in-process).

Uses the session's one Daphne (``live_url``) and the per-test ``browser_page`` from this
package's ``conftest``. An operator logs in, ``/operations/`` draws its four charts with
the locally served Plotly and no console errors. Then, while the page is open, the paper's
incidents are recorded and an ``incident_opened`` event is published, as
``incidents.services`` does after its commit: the GPU-hours chart must refetch and gain
its bars over the websocket, without a reload. The ORM runs in a worker thread because
Playwright's running loop makes Django refuse ORM calls in the test's own thread.
"""

from __future__ import annotations

import datetime as dt
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.db import connections
from django.utils import timezone

from dashboards.pages.operations import CHARTS
from dashboards.tests.factories import make_job, sandbox
from sandboxes.addresses import AddressFloor, SubnetFree
from sandboxes.models import Sandbox
from sandboxes.services.addresses import subnet_samples_record
from sandman_site import live

pytestmark = pytest.mark.browser

SCREENSHOT = "/tmp/operations.png"


def _bars(chart: str, trace: int = 0) -> str:
    return f"document.getElementById('chart-{chart}').data[{trace}].x.length"


@pytest.fixture
def seeded(transactional_db: None) -> None:
    """An operator, and warm and address-failing sandboxes in the last few minutes."""
    get_user_model().objects.create_user(username="operator", password="pw-op", is_staff=True)
    job = make_job("campaign-ops")
    requested = timezone.now() - dt.timedelta(minutes=5)
    Sandbox.objects.bulk_create(
        sandbox(
            job,
            requested_at=requested,
            scheduled_at=requested,
            ready_after_ms=2000,
            node="node-a",
            address_failures=i,
        )
        for i in range(3)
    )


def _record_incidents() -> None:
    try:
        call_command("loaddata", "paper_cases", verbosity=0)
    finally:
        connections.close_all()  # this worker thread's connection, before the DB is dropped


def _floor_reached() -> None:
    """The address watch's write when a subnet falls under the floor (it publishes
    ``address.floor`` after its commit, as the controller's watch does)."""
    try:
        gate = AddressFloor(floor=20)
        reading = [SubnetFree("subnet-a", "zone-a", 12)]
        change = gate.observe(reading)
        subnet_samples_record(subnets=reading, floor=20, change=change, now=timezone.now())
    finally:
        connections.close_all()


def test_operations_page_draws_four_charts_and_refreshes_on_a_pushed_incident(
    seeded: None, browser_page: Any, live_url: str
) -> None:
    page = browser_page
    page.goto(f"{live_url}/operations/")
    assert "/admin/login/" in page.url
    page.fill("#id_username", "operator")
    page.fill("#id_password", "pw-op")
    page.click("input[type=submit]")
    page.wait_for_url(f"{live_url}/operations/")
    page.wait_for_function(
        "document.body.dataset.drawn === 'yes' && document.body.dataset.ws === 'open'"
    )
    assert page.locator(".js-plotly-plot").count() == len(CHARTS) == 4
    for name in CHARTS:
        assert page.locator(f"#chart-{name} .main-svg").count() > 0
    assert page.evaluate(_bars("address_failures")) >= 1
    assert page.evaluate(_bars("warm_use")) == 1  # campaign-ops, one key
    assert page.evaluate(_bars("incident_hours")) == 0
    assert page.evaluate(_bars("free_addresses", 2)) == 0  # no floor change yet
    page.evaluate("window.__sameDocument = true")

    with ThreadPoolExecutor(max_workers=1) as pool:
        pool.submit(_record_incidents).result(timeout=60)
    live.publish("incident_opened", {"id": 0, "title": "paper cases", "stage": "outside"})

    page.wait_for_function(f"{_bars('incident_hours')} === 4 && {_bars('incident_hours', 1)} === 2")
    assert page.evaluate("window.__sameDocument") is True
    refreshes = page.evaluate("window.sandmanDashboard.refreshes")
    assert refreshes["incident_hours"]["lastReason"] == "event:incident_opened"
    assert page.locator("#table-incident_hours tbody tr").count() == 6

    # The address floor is reached: its event reaches the open page and the free-address
    # chart gains the "creates stopped" marker, without a reload.
    with ThreadPoolExecutor(max_workers=1) as pool:
        pool.submit(_floor_reached).result(timeout=60)
    page.wait_for_function(f"{_bars('free_addresses', 2)} === 1")
    refreshes = page.evaluate("window.sandmanDashboard.refreshes")
    assert refreshes["free_addresses"]["lastReason"] == "event:address.floor"
    assert page.evaluate("window.__sameDocument") is True

    page.screenshot(path=SCREENSHOT, full_page=True)
    assert page.errors == []  # type: ignore[attr-defined]
