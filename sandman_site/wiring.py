"""Start-up wiring: the ONE place that builds the process-wide controller with its listeners.

The controller (``sandboxes``) does not import the incidents app; this module, which sits
above both, hands it the incidents functions as :class:`ControllerHooks`: the sweep's
ownerless sandboxes open a draft incident, and every sweep runs the detectors. It also starts
the grading runner (``grading.runner``) beside an autostarted controller.

Rule a reader must not break: ``install()`` runs before anything calls
``get_controller()`` in a serving process (``sandman_site.startup``, from the ASGI
application); a controller built another way (tests, benchmarks) has no-op hooks unless it
is built with :func:`build_controller`.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.conf import settings

from grading.runner import GradingRunner, get_runner, set_runner
from incidents import detectors
from incidents import services as incident_services
from sandboxes.addresses import UrlSubnetSource
from sandboxes.controller import Controller, ControllerHooks, set_controller_builder
from sandboxes.providers import get_provider


def _ownerless_found(names: list[str], now: dt.datetime) -> None:
    incident_services.ownerless_pods_found(names=names, now=now)


def _after_sweep(now: dt.datetime) -> None:
    detectors.run_all(now=now)


def incident_hooks() -> ControllerHooks:
    """The incidents app's listeners for the controller's sweep."""
    return ControllerHooks(ownerless_found=_ownerless_found, after_sweep=_after_sweep)


def build_controller(**overrides: Any) -> Controller:
    """A controller with the backend from settings (unless ``provider=`` is given) and the
    incidents hooks; ``overrides`` are ``Controller`` arguments."""
    overrides.setdefault("provider_factory", get_provider)
    if settings.SANDMAN_SUBNETS_URL and "address_source" not in overrides:
        overrides["address_source"] = UrlSubnetSource(settings.SANDMAN_SUBNETS_URL)
    return Controller(hooks=incident_hooks(), **overrides)


def install() -> None:
    """Make ``get_controller()`` build the process-wide controller with this wiring."""
    set_controller_builder(build_controller)


def start_grading_runner(controller: Controller) -> None:
    """Start the process's grading runner beside its controller (once; ``grading.runner``)."""
    if get_runner() is None:
        runner = GradingRunner(controller=controller)
        set_runner(runner)
        runner.start()
