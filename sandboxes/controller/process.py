"""The process-wide controller: installed by start-up wiring or tests, built on first use.

Rule a reader must not break: ``sandboxes`` does not know which apps listen to the
controller. The process's start-up wiring (``sandman_site.wiring``) installs a builder
that adds them (the incidents hooks); without one, ``get_controller()`` builds a plain
``Controller()`` (the backend from settings, no hooks).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from sandboxes.controller.core import Controller

_controller: Controller | None = None
_builder: Callable[[], Controller] = Controller
_lock = threading.Lock()


def get_controller() -> Controller:
    """The process-wide controller, built by the installed builder on first use."""
    global _controller
    with _lock:
        if _controller is None:
            _controller = _builder()
        return _controller


def current_controller() -> Controller | None:
    """The installed controller, or None; never builds one (for /metrics scrapes)."""
    return _controller


def set_controller(controller: Controller | None) -> None:
    """Install a controller (tests), or forget the current one (None)."""
    global _controller
    with _lock:
        _controller = controller


def set_controller_builder(builder: Callable[[], Controller]) -> None:
    """How ``get_controller()`` builds the process-wide controller (start-up wiring)."""
    global _builder
    with _lock:
        _builder = builder
