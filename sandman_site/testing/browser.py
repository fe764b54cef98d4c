"""Debian's Chromium for the browser tests, launched the same way by every app's tests.

Chromium is the system one (``/usr/bin/chromium``, ``apt-get install chromium``) driven by
Playwright; it is never downloaded. The arguments keep it headless and off the network on
its own (no background fetches, component updates or sync).
"""

from __future__ import annotations

from typing import Any

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--headless",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]


def launch_chromium(playwright: Any, **options: Any) -> Any:
    """The system Chromium, launched through ``playwright`` (a started ``sync_playwright``)
    with :data:`CHROMIUM_ARGS`; ``options`` go to ``launch`` as they are."""
    return playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, **options)
