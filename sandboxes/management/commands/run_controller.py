"""``python manage.py run_controller``: the controller process of split processes.

Production on PostgreSQL runs the service as this process plus the ASGI server's worker
processes (README, architecture §3.1): this one owns the pools, creates, deletes, sweeps,
reconciliation and the grading runner, and answers the workers on the Unix socket
``SANDMAN_CONTROLLER_SOCKET`` (``sandboxes.controller.rpc``); the workers, started with the
same variable, start no controller of their own.

Order a reader must not break: the controller starts (and reconciles, §7) before the
socket listens, so no call reaches a controller that has not reconciled; on SIGTERM or
SIGINT the socket drains first (``ControllerRpcServer.stop``: new calls are answered 503
``controller_unavailable``, the calls in flight run to their answer for up to
``SANDMAN_CONTROLLER_DRAIN_S``, the rest are cancelled), then the grading runner and the
controller stop, and a Lease holder releases its Lease
(``startup.stop_service``). On the Kubernetes backend with leader election
on, the socket listens only once this process holds the Lease (``sandman_site/election.py``);
until then the workers answer 503 ``controller_unavailable``.
"""

from __future__ import annotations

import logging
import signal
import threading
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from sandboxes.controller import ControllerRpcServer, get_controller
from sandman_site import startup
from sandman_site.diagnostics import enable_stack_dumps
from sandman_site.heap import freeze_start_up

log = logging.getLogger(__name__)


class Command(BaseCommand):
    help = "Run the sandbox controller and answer web workers on SANDMAN_CONTROLLER_SOCKET."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--socket", default="", help="overrides SANDMAN_CONTROLLER_SOCKET")

    def handle(self, *args: Any, **options: Any) -> None:
        path = options["socket"] or settings.SANDMAN_CONTROLLER_SOCKET
        if not path:
            raise CommandError("set SANDMAN_CONTROLLER_SOCKET (or --socket) to a socket path")
        enable_stack_dumps()  # kill -USR1 <pid>: every thread's stack on stderr
        stop = threading.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop.set())
        startup.start_controller_once(here=True)
        controller = get_controller()
        # A standby (leader election): the elector starts the controller on taking the Lease;
        # until then nothing listens, and the workers answer 503 controller_unavailable.
        while not controller.started:
            if stop.wait(0.5):
                startup.stop_service()
                return
        server = ControllerRpcServer(controller, path)
        server.start()
        freeze_start_up()  # the start's objects out of every later full collection
        self.stdout.write(f"controller listening on {path}\n")
        self.stdout.flush()
        stop.wait()
        counts = server.stop(drain_s=settings.SANDMAN_CONTROLLER_DRAIN_S)
        self.stdout.write(
            "controller socket closed: {drained} calls drained, {cut} cut\n".format(**counts)
        )
        self.stdout.flush()
        # The runner, then the controller; a Lease holder then releases its Lease.
        startup.stop_service()
