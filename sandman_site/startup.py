"""The controller's start-up hook: wire it, and start it once per process when the settings
say so.

Rule a reader must not break: the wiring is installed before the process-wide controller is
first built, whether or not it autostarts (``wiring.install``).
"""

from __future__ import annotations

import logging
import threading

from django.conf import settings

from sandboxes.controller import get_controller
from sandman_site import wiring

log = logging.getLogger(__name__)
_lock = threading.Lock()


def start_controller_once() -> None:
    wiring.install()
    if not settings.SANDMAN_CONTROLLER_AUTOSTART:
        return
    with _lock:
        controller = get_controller()
        if not controller.started:
            controller.start()
            log.info("controller started (backend %s)", settings.SANDMAN_BACKEND)
        wiring.start_grading_runner(controller)
