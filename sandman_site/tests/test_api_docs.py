"""The API docs page (Swagger UI) is served from installed packages, no CDN (issue 12
item 1): the page's HTML names only this server's paths, and headless Chromium rendering
it against the real service asks no other host for anything."""

from __future__ import annotations

import re
import shutil

import pytest
from django.test import Client

from sandman_site.testing.browser import CHROMIUM, launch_chromium
from sandman_site.testing.server import Served


@pytest.mark.django_db
def test_the_docs_page_references_only_this_servers_paths(client: Client) -> None:
    response = client.get("/api/v1/docs/")
    assert response.status_code == 200
    html = response.content.decode()
    urls = re.findall(r'(?:src|href)="([^"]*)"', html)
    assert urls and all(url.startswith("/") and not url.startswith("//") for url in urls), urls
    assert "/static/drf_spectacular_sidecar/swagger-ui-dist/swagger-ui-bundle.js" in urls
    assert not re.search(r"https?://", html), re.findall(r"https?://[^\s\"']+", html)


@pytest.mark.browser
def test_swagger_ui_renders_every_operation_without_leaving_the_server(served: Served) -> None:
    if not shutil.which(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is not installed (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    requested: list[str] = []
    errors: list[str] = []
    with sync_playwright() as playwright:
        browser = launch_chromium(playwright)
        try:
            page = browser.new_page()
            page.on("request", lambda request: requested.append(request.url))
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(f"{served.url}/api/v1/docs/")
            page.wait_for_selector("text=/api/v1/jobs/{job_id}/acquire/", timeout=30_000)
            operations = page.locator(".opblock").count()
        finally:
            browser.close()
    assert errors == []
    outside = [url for url in requested if not url.startswith(served.url)]
    assert outside == []
    assert f"{served.url}/api/v1/schema/" in requested
    assert operations >= 28  # every operation of the document is drawn
