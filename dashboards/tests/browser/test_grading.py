"""The grading page in headless Chromium against the real ASGI app (Daphne, in-process):
an operator logs in, ``/gradings/`` draws its four charts with the locally served Plotly
and no console errors, then a pushed ``grading.state`` event refetches the verdict chart.
The ORM runs in a worker thread because Playwright's running loop makes Django refuse ORM
calls in the test's own thread."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db import connections

from dashboards.pages.grading import CHARTS
from dashboards.tests.grading_seed import seed_gradings
from sandman_site import live

pytestmark = pytest.mark.browser


def _seed() -> None:
    try:
        seed_gradings()
    finally:
        connections.close_all()


@pytest.fixture
def operator(transactional_db: None) -> None:
    get_user_model().objects.create_user(username="operator", password="pw-op", is_staff=True)


def test_the_grading_page_draws_four_charts_without_console_errors_and_follows_gradings(
    operator: None, browser_page: Any, live_url: str
) -> None:
    page = browser_page
    page.goto(f"{live_url}/gradings/")
    page.fill("#id_username", "operator")
    page.fill("#id_password", "pw-op")
    page.click("input[type=submit]")
    page.wait_for_url(f"{live_url}/gradings/")
    page.wait_for_function(
        "document.body.dataset.drawn === 'yes' && document.body.dataset.ws === 'open'"
    )
    assert page.locator(".js-plotly-plot").count() == len(CHARTS) == 4
    for name in CHARTS:
        assert page.locator(f"#chart-{name} .main-svg").count() > 0
    bars = "document.getElementById('chart-verdicts').data[0].x.length"
    assert page.evaluate(bars) == 0

    with ThreadPoolExecutor(max_workers=1) as pool:
        pool.submit(_seed).result(timeout=60)
    live.publish("grading.state", {"grading_id": 0, "job_id": 0, "verdict": "resolved"})
    page.wait_for_function(f"{bars} === 1")
    refreshes = page.evaluate("window.sandmanDashboard.refreshes")
    assert refreshes["verdicts"]["lastReason"] == "event:grading.state"
    assert page.errors == []  # type: ignore[attr-defined]
