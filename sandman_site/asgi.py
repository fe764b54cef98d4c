"""ASGI entry point: HTTP through Django, websockets through Channels routing.

The controller (pool, reconciliation, sweeps) starts here, once per process, when
``SANDMAN_CONTROLLER_AUTOSTART`` is on; it runs its asyncio tasks on its own loop thread.
"""

from __future__ import annotations

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "sandman_site.settings.dev")
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from sandman_site.routing import websocket_urlpatterns  # noqa: E402
from sandman_site.startup import start_controller_once  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": AllowedHostsOriginValidator(
            AuthMiddlewareStack(URLRouter(websocket_urlpatterns))
        ),
    }
)

start_controller_once()
