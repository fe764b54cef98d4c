"""Websocket routes of this app (Channels)."""

from __future__ import annotations

websocket_urlpatterns: list = []
