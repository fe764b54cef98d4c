"""The controller's start-up hook: wire it, and start it once per process when the settings
say so -- at once (the local backend: one process, no Lease), or once this replica holds
the controller's Lease (the Kubernetes backend with ``SANDMAN_LEADER_ELECTION`` on;
``sandman_site/election.py``).

Rule a reader must not break: the wiring is installed before the process-wide controller is
first built, whether or not it autostarts (``wiring.install``). With split processes
(``SANDMAN_CONTROLLER_SOCKET``) only ``manage.py run_controller`` starts a controller.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from django.conf import settings

from sandboxes.controller import get_controller
from sandboxes.providers.kubernetes.config import build_api_client, config_from_settings
from sandman_site import election, wiring

log = logging.getLogger(__name__)
_lock = threading.Lock()


def start_controller_once(*, here: bool = False) -> None:
    """Start this process's controller if the settings say so; ``here``: whatever they say
    (``manage.py run_controller``). A web worker of split processes
    (``SANDMAN_CONTROLLER_SOCKET`` set) never starts one: the controller process runs it."""
    wiring.install()
    if not here and (
        not settings.SANDMAN_CONTROLLER_AUTOSTART or settings.SANDMAN_CONTROLLER_SOCKET
    ):
        return
    with _lock:
        if election_wanted(settings):
            if election.current() is None:
                elector = build_elector(settings, on_started=_start_controller, on_stopped=_exit)
                election.set_current(elector)
                elector.start()
            return
        _start_controller()


def election_wanted(conf: Any) -> bool:
    """Leader election runs on the Kubernetes backend only, unless turned off."""
    return conf.SANDMAN_BACKEND == "kubernetes" and bool(conf.SANDMAN_LEADER_ELECTION)


def election_settings(conf: Any) -> election.ElectionSettings:
    return election.ElectionSettings(
        namespace=conf.SANDMAN_LEASE_NAMESPACE or conf.SANDMAN_NAMESPACE,
        identity=conf.SANDMAN_REPLICA_ID or election.default_identity(),
        lease_name=conf.SANDMAN_LEASE_NAME,
        lease_duration_s=conf.SANDMAN_LEASE_DURATION_S,
        renew_deadline_s=conf.SANDMAN_LEASE_RENEW_DEADLINE_S,
        retry_period_s=conf.SANDMAN_LEASE_RETRY_PERIOD_S,
    )


def build_elector(conf: Any, *, on_started: Any, on_stopped: Any) -> election.LeaderElector:
    """An elector on the same cluster configuration as the provider (its own client)."""
    api_client = build_api_client(config_from_settings(conf))
    mark = None
    if conf.SANDMAN_REPLICA_ID and conf.SANDMAN_POD_NAMESPACE:
        mark = election.LeaderMark(
            api_client, pod=conf.SANDMAN_REPLICA_ID, namespace=conf.SANDMAN_POD_NAMESPACE
        )
    return election.LeaderElector(
        election_settings(conf),
        api_client=api_client,
        on_started=on_started,
        on_stopped=on_stopped,
        mark=mark,
    )


def _start_controller() -> None:
    controller = get_controller()
    if not controller.started:
        controller.start()
        log.info("controller started (backend %s)", settings.SANDMAN_BACKEND)
    wiring.start_grading_runner(controller)


def _exit() -> None:
    """Leadership lost: end the process (client-go controllers exit the same way) so the
    kubelet restarts it as a standby with no stale pool books; the next leader reconciles."""
    log.critical("leadership lost; exiting so that this replica restarts as a standby")
    logging.shutdown()
    os._exit(1)
