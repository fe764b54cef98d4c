"""The controller's start-up hook: wire it, and start it once per process when the settings
say so -- at once (the local backend: one process, no Lease), or once this replica holds
the controller's Lease (the Kubernetes backend with ``SANDMAN_LEADER_ELECTION`` on;
``sandman_site/election.py``).

Rules a reader must not break:

* The wiring is installed before the process-wide controller is first built, whether or
  not it autostarts (``wiring.install``). With split processes
  (``SANDMAN_CONTROLLER_SOCKET``) only ``manage.py run_controller`` starts a controller.
* An orderly stop (SIGTERM, SIGINT) resigns the Lease while the process still accepts
  work (Daphne: a Twisted "before shutdown" trigger, run in a thread the reactor waits
  for), never from ``atexit``: by then no executor takes new work, and the controller's
  shutdown needs one. The grading runner stops before the controller, and both before the
  release (``LeaderElector.resign``). A stop that comes while this replica holds the Lease
  but its controller is still starting waits for that start first (``wait_started``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

from django.conf import settings

from grading.runner import get_runner
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
                if not here:  # run_controller resigns from its own signal handling
                    on_server_stop(_resign)
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


def on_server_stop(hook: Callable[[], None]) -> bool:
    """Run ``hook`` when the server begins to stop, before the interpreter shuts down;
    False (and a warning) under a server this does not know (the Lease then expires)."""
    reactor: Any = sys.modules.get("twisted.internet.reactor")
    if reactor is None:
        log.warning("not under Daphne: an orderly stop will not release the Lease")
        return False
    from twisted.internet import threads

    def before_shutdown() -> Any:
        done = threads.deferToThread(hook)
        done.addBoth(lambda _: _cancel_orphaned_tasks())
        return done  # the reactor waits for it before it stops

    reactor.addSystemEventTrigger("before", "shutdown", before_shutdown)
    return True


def _cancel_orphaned_tasks() -> Any:
    """Cancel what the server's loop still runs once Daphne killed its applications, and
    let them end (a Deferred the reactor waits for, at most 5 s).

    Daphne cancels each request's application, but Django's handler leaves its
    ``listen_for_disconnect`` task waiting on ``receive()``; Daphne never cancels tasks
    (``asyncio.run`` would), and the interpreter then finalizes those suspended coroutines
    at exit (a segfault on CPython 3.11, seen once the controller had stopped first). Runs
    in the reactor's thread, inside its running loop."""
    from twisted.internet.defer import Deferred

    tasks = asyncio.all_tasks(asyncio.get_running_loop())
    for task in tasks:
        task.cancel()
    if not tasks:
        return None
    return Deferred.fromFuture(asyncio.ensure_future(asyncio.wait(tasks, timeout=5)))


# The grading runner's wait for the grading in hand; a longer one keeps the Lease to expire.
RUNNER_STOP_S = 10.0
# A stop during the new holder's start waits this long for the start (its reconcile) to
# end; inside terminationGracePeriodSeconds (60 s in k8s/sandman.yaml) with the stop after.
START_WAIT_S = 30.0


def _stop_work() -> bool:
    """Stop what the Lease guards: the grading runner, then the controller (it uses it)."""
    runner = get_runner()
    runner_stopped = runner is None or runner.stop(timeout_s=RUNNER_STOP_S)
    controller_stopped = get_controller().stop()
    return runner_stopped and controller_stopped


def _resign() -> None:
    elector = election.current()
    if elector is not None:
        elector.wait_started(START_WAIT_S)  # a start under way ends first: then resign
        elector.resign(_stop_work)


def stop_service() -> None:
    """An orderly stop of what this process runs (``manage.py run_controller``): with an
    elector, its resign (work stopped first, then the Lease released by a holder; a
    standby ends its candidacy); without one, the grading runner and the controller."""
    if election.current() is not None:
        _resign()
    else:
        _stop_work()


def _exit() -> None:
    """Leadership lost: end the process (client-go controllers exit the same way) so the
    kubelet restarts it as a standby with no stale pool books; the next leader reconciles."""
    log.critical("leadership lost; exiting so that this replica restarts as a standby")
    logging.shutdown()
    os._exit(1)
