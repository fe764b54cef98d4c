"""Websocket routes of the operator pages (Channels): the live push channel.

Gathered with every app's routes by ``sandman_site.routing`` for ``sandman_site.asgi``.
"""

from __future__ import annotations

from django.urls import path

from dashboards.consumers import DashboardConsumer

websocket_urlpatterns = [
    path("ws/dashboard/", DashboardConsumer.as_asgi(), name="ws-dashboard"),
]
