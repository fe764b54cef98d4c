"""Websocket routes of every app, gathered for ``asgi.py``."""

from __future__ import annotations

from incidents.routing import websocket_urlpatterns as incident_ws
from sandboxes.routing import websocket_urlpatterns as sandbox_ws

websocket_urlpatterns = [*sandbox_ws, *incident_ws]
