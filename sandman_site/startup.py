"""The controller's start-up hook: start it once per process when the settings say so."""

from __future__ import annotations

import logging
import threading

from django.conf import settings

log = logging.getLogger(__name__)
_lock = threading.Lock()


def start_controller_once() -> None:
    if not settings.SANDMAN_CONTROLLER_AUTOSTART:
        return
    with _lock:
        from sandboxes.controller import get_controller

        controller = get_controller()
        if not controller.started:
            controller.start()
            log.info("controller started (backend %s)", settings.SANDMAN_BACKEND)
