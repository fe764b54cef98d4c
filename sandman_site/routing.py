"""Websocket routes of every app, gathered for ``asgi.py``."""

from __future__ import annotations

from dashboards.routing import websocket_urlpatterns as dashboard_ws
from incidents.routing import websocket_urlpatterns as incident_ws

websocket_urlpatterns = [*dashboard_ws, *incident_ws]
