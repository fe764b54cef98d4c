"""ASGI entry point: HTTP through Django, websockets through Channels routing.

The controller (pool, reconciliation, sweeps) starts here, once per process, when
``SANDMAN_CONTROLLER_AUTOSTART`` is on; it runs its asyncio tasks on its own loop thread.
"""

from __future__ import annotations

import logging
import os
from importlib import import_module

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "sandman_site.settings.dev")
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.conf import settings  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402

from sandboxes.apis.fastpath import hot_routes  # noqa: E402
from sandman_site.diagnostics import enable_stack_dumps  # noqa: E402
from sandman_site.heap import freeze_start_up  # noqa: E402
from sandman_site.lifespan import lifespan  # noqa: E402
from sandman_site.routing import websocket_urlpatterns  # noqa: E402
from sandman_site.startup import start_controller_once  # noqa: E402


def build_application(*, serve_static: bool) -> ProtocolTypeRouter:
    """The ASGI app; ``serve_static`` serves /static/ (dashboard JS, Plotly) from Django.

    A plain ``daphne``/``uvicorn`` process (production, the browser tests) has nothing else
    to serve the dashboards' scripts, so this is on unless ``SANDMAN_SERVE_STATIC`` is set
    off (static files served by an ingress instead). Under ``runserver`` it is harmless.
    """
    http_app = ASGIStaticFilesHandler(django_asgi_app) if serve_static else django_asgi_app
    return ProtocolTypeRouter(
        {
            # Known callers' acquire/release skip Django's handler (sandboxes.apis.fastpath).
            "http": hot_routes(http_app),
            "websocket": AllowedHostsOriginValidator(
                AuthMiddlewareStack(URLRouter(websocket_urlpatterns))
            ),
            # A worker's start and end (uvicorn): the direct hand-out's pool opened, closed.
            "lifespan": lifespan,
        }
    )


def warm_up() -> None:
    """Import now what a worker's first requests would import: the URLconf and every view it
    names, and the fast path's routes with the direct hand-out (``hot_routes`` imports them
    on first use). Without it a worker's first burst of acquires waited in its event loop
    for about a second of imports (drf-spectacular, jinja2 and ``django.test`` by way of
    the views' schema decorators), which was the tail of the first round of a burst.

    A web worker of split processes also builds the provider it checks acquires' images
    with (``RemoteController.image_checker``): 48 ms on an idle host, spent in the event
    loop of the worker's first acquire, and ~80 ms inside a burst, with the burst's other
    requests waiting behind it (measured per request in ``bench/acquire_latency.py``'s
    first round). A failure to build it is logged; the first acquire then builds it, as before."""
    from django.urls import get_resolver

    get_resolver().url_patterns  # noqa: B018 - the property imports the URLconf
    for module in ("common", "direct", "jobs", "sandboxes"):
        import_module(f"sandboxes.apis.{module}")
    if settings.SANDMAN_CONTROLLER_SOCKET:
        from sandboxes.apis.common import controller
        from sandboxes.controller.remote import RemoteController

        remote = controller()
        try:
            if isinstance(remote, RemoteController):
                remote.image_checker()
        except Exception:  # noqa: BLE001 - warming only: the first acquire tries again
            logging.getLogger(__name__).warning(
                "the image checker could not be built at start", exc_info=True
            )


enable_stack_dumps()  # kill -USR1 <pid>: every thread's stack on stderr
application = build_application(serve_static=bool(getattr(settings, "SANDMAN_SERVE_STATIC", True)))
warm_up()

start_controller_once()
# Last: what the start built is never walked again by a full collection (sandman_site.heap).
freeze_start_up()
