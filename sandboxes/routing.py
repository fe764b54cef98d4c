"""Websocket routes of this app (Channels): the live dashboards' push channel."""

from __future__ import annotations

from django.urls import path

from sandboxes.consumers import DashboardConsumer

websocket_urlpatterns = [
    path("ws/dashboard/", DashboardConsumer.as_asgi(), name="ws-dashboard"),
]
