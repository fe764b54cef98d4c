"""The accounting page in headless Debian Chromium: chart drawn, table shown, no errors.

Chromium is the system one (``/usr/bin/chromium``) launched by Playwright; it is never
downloaded. The page is served by pytest-django's ``live_server`` (static files included,
so Plotly comes from ``/static/plotly/``); any request that leaves the live server fails
the test. The screenshot goes to ``/tmp/accounting.png`` for a human to look at.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlparse

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test import Client

from sandman_site.testing.browser import launch_chromium

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

SCREENSHOT = "/tmp/accounting.png"


def session_cookie(live_url: str) -> dict[str, Any]:
    user = get_user_model().objects.create_user("viewer", password="pw", is_staff=True)
    client = Client()
    client.force_login(user)
    value = client.cookies[settings.SESSION_COOKIE_NAME].value
    host = urlparse(live_url).hostname
    return {"name": settings.SESSION_COOKIE_NAME, "value": value, "domain": host, "path": "/"}


def test_the_accounting_page_draws_table_a49_bars_without_console_errors(live_server: Any) -> None:
    """Table A49 from the paper fixture: 6 class bars (4 sandbox path, 2 outside it)."""
    from playwright.sync_api import sync_playwright

    call_command("loaddata", "paper_cases", verbosity=0)
    cookie = session_cookie(live_server.url)
    origin = live_server.url.rstrip("/")
    problems: list[str] = []
    outside: list[str] = []

    with sync_playwright() as pw:
        browser = launch_chromium(pw, headless=True)
        try:
            context = browser.new_context(viewport={"width": 1500, "height": 1300})
            context.add_cookies([cookie])

            def guard(route: Any) -> None:
                if route.request.url.startswith(origin):
                    route.continue_()
                else:
                    outside.append(route.request.url)
                    route.abort()

            context.route("**/*", guard)
            page = context.new_page()

            def console(message: Any) -> None:
                if message.type == "error":
                    problems.append(message.text)

            page.on("console", console)
            page.on("pageerror", lambda e: problems.append(str(e)))
            page.on("requestfailed", lambda r: problems.append(f"failed: {r.url}"))

            response = page.goto(f"{origin}/incidents/accounting/", wait_until="load")
            assert response is not None and response.status == 200
            page.wait_for_selector("#accounting-by-class .main-svg", timeout=15000)
            page.wait_for_selector("#accounting-by-workload .main-svg", timeout=15000)

            class_bars = page.locator("#accounting-by-class g.trace.bars g.point")
            assert class_bars.count() == 6
            traces = page.evaluate(
                """() => document.getElementById('accounting-by-class').data.map(
                    t => ({name: t.name, x: t.x, y: t.y, minus: t.error_y.arrayminus}))"""
            )
            assert [t["name"] for t in traces] == ["sandbox path", "outside the sandbox path"]
            sandbox = dict(zip(traces[0]["x"], traces[0]["y"], strict=True))
            assert sandbox == {
                "sandbox implementation": 1469,
                "implementation and Kubernetes default": 135,
                "cluster or shared service": 1207,
                "not established": 1347,
            }
            assert traces[0]["minus"] == [495, 12, 187, 0]
            assert dict(zip(traces[1]["x"], traces[1]["y"], strict=True)) == {
                "cluster or shared service": 1309,
                "not established": 2351,
            }
            # Each drawn bar has a real height (a path with a vertical extent).
            heights = page.evaluate(
                """() => [...document.querySelectorAll(
                    '#accounting-by-class g.trace.bars g.point path')].map(
                    p => p.getBoundingClientRect().height)"""
            )
            assert len(heights) == 6 and all(h > 1 for h in heights)
            assert page.locator("#accounting-by-workload g.trace.bars g.point").count() == 8

            assert page.locator("#total-all").inner_text() == "7,124–7,818"
            assert page.locator("#total-sandbox").inner_text() == "3,464–4,158"
            assert page.locator("#by-class tbody tr").count() == 6
            page.screenshot(path=SCREENSHOT, full_page=True)
        finally:
            browser.close()

    assert problems == []
    assert outside == []
