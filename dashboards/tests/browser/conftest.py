"""Browser fixtures: the real ASGI app under Daphne (in-process) and Debian's Chromium.

* ``live_url`` (session): Daphne in a thread of this process serving
  ``sandman_site.asgi.build_application(serve_static=True)`` on a free loopback port,
  against pytest-django's test database; stopped at the end of the session.
* ``browser_page`` (per test): Playwright driving ``/usr/bin/chromium`` headless with no
  outside connections, closed after the test. While Playwright runs, its event loop is
  "running" in the test's thread, so Django refuses ORM calls there: request data
  fixtures (and the ``controller`` fixture, whose teardown runs ``asyncio.run``) BEFORE
  ``browser_page`` in the test's signature, so they are set up before it and torn down
  after it.
* Console errors and uncaught page errors are collected on ``page.errors``.
* ``controller`` and its helpers: the sandboxes tests' own fixtures (imported below).
"""

from __future__ import annotations

import gc
import shutil
from collections.abc import Iterator
from typing import Any

import pytest

from dashboards.tests.browser.daphne_thread import DaphneThread

# The real controller over the real local provider, for the live-push test (its fixtures
# live with the controller's tests; re-exported here so pytest finds them for this folder).
from sandboxes.tests.conftest import (  # noqa: F401
    controller,
    make_controller,
    sandbox_root,
    spawner,
)
from sandman_site.testing.browser import CHROMIUM, launch_chromium


@pytest.fixture(scope="session")
def live_url(django_db_setup: None) -> Iterator[str]:
    from sandman_site.asgi import build_application

    server = DaphneThread(build_application(serve_static=True))
    url = server.start()
    try:
        yield url
    finally:
        server.stop()
        # Django runs each ASGI request in its own short-lived thread; with CONN_MAX_AGE > 0
        # that thread's connection is only closed when the garbage collector frees it
        # (Django: "When using ASGI, persistent connections should be disabled"). Free
        # them now, or PostgreSQL refuses to drop the test database.
        gc.collect()


@pytest.fixture
def browser_page(transactional_db: None, live_url: str) -> Iterator[Any]:
    if not shutil.which(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is not installed (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = launch_chromium(playwright)
        context = browser.new_context(viewport={"width": 1400, "height": 1000})
        page = context.new_page()
        page.set_default_timeout(30_000)
        page.errors = []  # type: ignore[attr-defined]
        page.on(
            "console",
            lambda msg: (
                page.errors.append(f"console: {msg.text}")  # type: ignore[attr-defined]
                if msg.type == "error"
                else None
            ),
        )
        page.on("pageerror", lambda exc: page.errors.append(f"pageerror: {exc}"))  # type: ignore[attr-defined]
        try:
            yield page
        finally:
            context.close()
            browser.close()
