"""Hooks the controller calls after a sweep: how other apps learn what it found.

The controller does not know who listens: the process's start-up wiring
(``sandman_site.wiring``) fills :class:`ControllerHooks` with the incidents app's
functions; a controller built without hooks (tests, benchmarks) calls the no-op defaults.

Rules a reader must not break:
* Hooks run on the controller's DATABASE threads (they may use the ORM), never on its loop.
* A hook that raises is logged with its traceback and counted in the sweep's report
  (``hook_failures``); it never stops the sweep and is never silently dropped.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)


def _no_ownerless(names: list[str], now: dt.datetime) -> None:
    """Default: nobody listens for ownerless sandboxes (the sweep's log says it)."""


def _no_after_sweep(now: dt.datetime) -> None:
    """Default: nothing runs after a sweep."""


@dataclass(frozen=True)
class ControllerHooks:
    """What the sweep reports outward: ownerless sandboxes, and "a sweep just ended"."""

    ownerless_found: Callable[[list[str], dt.datetime], None] = _no_ownerless
    after_sweep: Callable[[dt.datetime], None] = _no_after_sweep


def run_hook(name: str, hook: Callable[[], None]) -> bool:
    """Call ``hook`` (a database thread); False, logged with its traceback, if it raised."""
    try:
        hook()
    except Exception:  # any failure of another app's hook: logged and counted, not fatal
        log.exception("controller hook %s failed", name)
        return False
    return True
