"""Every operator page in headless Chromium: drawn with no console error and no request
leaving 127.0.0.1; the filters change the charts and the URL (issue 11 item 7).

Uses the session's one Daphne (``live_url``) and the per-test ``browser_page`` of this
package's ``conftest``. Records are stored through the real ingest services before the
browser starts (the ORM may not run in Playwright's thread).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from django.contrib.auth import get_user_model

from dashboards.tests.pages.test_training import seed_example

pytestmark = pytest.mark.browser

PAGES = ("/", "/operations/", "/training/", "/incidents/", "/incidents/accounting/")
ROWS = "document.querySelectorAll('#table-critical_path tbody tr').length"


@pytest.fixture
def two_jobs(transactional_db: None) -> tuple[int, int]:
    get_user_model().objects.create_user(username="operator", password="pw-op", is_staff=True)
    return seed_example("campaign-one"), seed_example("campaign-two")


def _log_in(page: Any, live_url: str, path: str) -> None:
    page.goto(f"{live_url}{path}")
    page.fill("#id_username", "operator")
    page.fill("#id_password", "pw-op")
    page.click("input[type=submit]")
    page.wait_for_url(f"{live_url}{path}")


def test_every_operator_page_renders_without_console_errors_or_outside_requests(
    two_jobs: tuple[int, int], browser_page: Any, live_url: str
) -> None:
    page = browser_page
    hosts: set[str] = set()
    page.on("request", lambda request: hosts.add(urlsplit(request.url).hostname or ""))
    _log_in(page, live_url, "/")
    for path in PAGES:
        page.goto(f"{live_url}{path}")
        page.wait_for_load_state("networkidle")
        if path in ("/", "/operations/", "/training/"):
            page.wait_for_function("document.body.dataset.drawn === 'yes'")
            assert page.locator(".js-plotly-plot").count() > 0, path
    assert hosts == {"127.0.0.1"}
    assert page.errors == []  # type: ignore[attr-defined]


def test_the_job_filter_changes_the_charts_and_the_url_and_survives_a_reload(
    two_jobs: tuple[int, int], browser_page: Any, live_url: str
) -> None:
    one, two = two_jobs
    page = browser_page
    _log_in(page, live_url, "/training/")
    page.wait_for_function(f"document.body.dataset.drawn === 'yes' && {ROWS} === 2")
    labels = page.evaluate("document.getElementById('chart-critical_path').data[0].y")
    assert len(labels) == 2
    page.fill("#filter-job", str(two))
    page.select_option("#filter-backend", "")
    page.click("#filter-apply")
    page.wait_for_function(f"document.body.dataset.drawn === 'yes' && {ROWS} === 1")
    query = parse_qs(urlsplit(page.url).query)
    assert query["job"] == [str(two)]
    assert page.evaluate("document.getElementById('chart-critical_path').data[0].y") == [
        f"campaign-two (#{two})"
    ]
    csv_href = page.get_attribute("#card-critical_path a.csv", "href")
    assert f"job={two}" in csv_href
    assert page.evaluate("document.body.dataset.query").find(f"job={two}") >= 0
    # The shared URL shows the same view; the 15-minute link keeps the filter.
    page.click("text=15 min")
    page.wait_for_function(f"document.body.dataset.drawn === 'yes' && {ROWS} === 1")
    assert parse_qs(urlsplit(page.url).query)["job"] == [str(two)]
    assert parse_qs(urlsplit(page.url).query)["minutes"] == ["15"]
    page.select_option("#filter-backend", "kubernetes")
    page.click("#filter-apply")
    page.wait_for_function(f"document.body.dataset.drawn === 'yes' && {ROWS} === 1")
    assert "backend=kubernetes" in page.url
    assert page.locator("#table-critical_path tbody td").first.text_content() == (
        "no rows in this window"
    )
    assert one != two
    assert page.errors == []  # type: ignore[attr-defined]
