"""The training page in headless Chromium against the real ASGI app (Daphne, in-process).

An operator logs in; ``/training/`` draws its five charts with the locally served Plotly
and no console error. Then, while the page is open, a trajectory batch and a learner step
are stored through the real ingest services in a worker thread (Playwright's running loop
makes Django refuse ORM calls in the test's own thread); their after-commit events must
move the Figure 5 chart within 2 s, without a reload.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db import connections

from dashboards.pages.training import CHARTS
from dashboards.tests.pages.test_training import seed_example

pytestmark = pytest.mark.browser

BARS = "document.getElementById('chart-critical_path').data[{trace}].x.length"
LEARNER = "document.getElementById('chart-critical_path').data[{trace}].x[0]"


@pytest.fixture
def operator(transactional_db: None) -> None:
    get_user_model().objects.create_user(username="operator", password="pw-op", is_staff=True)


def _seed() -> int:
    try:
        return seed_example("campaign-live")
    finally:
        connections.close_all()  # this worker thread's connection, before the DB is dropped


def test_training_page_draws_and_a_new_batch_moves_figure_5_without_a_reload(
    operator: None, browser_page: Any, live_url: str
) -> None:
    from sandboxes.critical_path import CATEGORIES

    page = browser_page
    page.goto(f"{live_url}/training/")
    page.fill("#id_username", "operator")
    page.fill("#id_password", "pw-op")
    page.click("input[type=submit]")
    page.wait_for_url(f"{live_url}/training/")
    page.wait_for_function(
        "document.body.dataset.drawn === 'yes' && document.body.dataset.ws === 'open'"
    )
    assert page.locator(".js-plotly-plot").count() == len(CHARTS) == 5
    for name in CHARTS:
        assert page.locator(f"#chart-{name} .main-svg").count() > 0
    assert page.evaluate(BARS.format(trace=0)) == 0
    page.evaluate("window.__sameDocument = true")

    with ThreadPoolExecutor(max_workers=1) as pool:
        pool.submit(_seed).result(timeout=60)
    stored = time.monotonic()
    learner = CATEGORIES.index("learner")
    # Issue 11 asks for the move within 2 s; that is a speed, measured and printed here (the
    # house rule: no timing thresholds in tests). The wait only bounds a hang.
    page.wait_for_function(f"{BARS.format(trace=learner)} === 1", timeout=30_000)
    print(f"critical-path chart moved {time.monotonic() - stored:.3f} s after the batch")
    assert page.evaluate(LEARNER.format(trace=learner)) == 40.0
    assert page.evaluate("window.__sameDocument") is True
    refreshes = page.evaluate("window.sandmanDashboard.refreshes")
    assert refreshes["critical_path"]["lastReason"] in {
        "event:trajectories",
        "event:learner_steps",
    }
    assert page.locator("#table-critical_path tbody tr").count() == 1
    assert page.errors == []  # type: ignore[attr-defined]
