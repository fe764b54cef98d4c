"""The controller facade (agreed contract): ``Controller``, ``AcquireResult``, ``PrewarmKey``,
``get_controller()`` and ``set_controller()``.

Implementation lives in this package: ``core`` (loop thread, facade), ``acquire``
(warm hand-out, owned creates), ``lifecycle`` (release, delete, drain, prewarm, checked
reuse), ``maintenance`` (trim, reclaim, retries, sweep), ``reconcile`` (start-up),
``queries`` (reads), ``dbexec`` (ORM off the loop thread), ``runtime`` (per-job state).
"""

from __future__ import annotations

from sandboxes.controller.core import (
    Controller,
    current_controller,
    get_controller,
    set_controller,
)
from sandboxes.controller.runtime import AcquireResult, PrewarmKey

__all__ = [
    "AcquireResult",
    "Controller",
    "PrewarmKey",
    "current_controller",
    "get_controller",
    "set_controller",
]
