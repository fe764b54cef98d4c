"""Websocket consumer of the operator pages' live push.

:class:`DashboardConsumer` serves ``/ws/dashboard/``: a staff user's page joins the group
``sandman_site.live.GROUP`` and receives every ``dashboard.event`` as
``{"kind": str, "payload": dict}`` (payload kinds are documented in ``sandman_site.live``).

Invariants:
* Only operators join: the pages' one rule (``dashboards.access.is_operator``: active
  staff); anyone else is closed with code 4403 before the handshake completes, so nothing
  is ever sent to them.
* The consumer joins the group BEFORE it accepts: once the browser sees ``open``, no
  later publish can miss it. Its loop is registered with ``sandman_site.live`` while it is
  connected, so publishes from other threads are delivered on this loop.
* The socket is push-only: anything the client sends is ignored.
"""

from __future__ import annotations

import asyncio
from typing import Any

from channels.generic.websocket import AsyncJsonWebsocketConsumer

from dashboards.access import is_operator
from sandman_site import live

CLOSE_FORBIDDEN = 4403


class DashboardConsumer(AsyncJsonWebsocketConsumer):
    joined = False

    async def connect(self) -> None:
        if not is_operator(self.scope.get("user")) or self.channel_layer is None:
            await self.close(code=CLOSE_FORBIDDEN)
            return
        await self.channel_layer.group_add(live.GROUP, self.channel_name)
        live.listener_joined(asyncio.get_running_loop())
        self.joined = True
        await self.accept()

    async def disconnect(self, code: int) -> None:
        if self.joined:
            self.joined = False
            live.listener_left(asyncio.get_running_loop())
            await self.channel_layer.group_discard(live.GROUP, self.channel_name)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        """Push-only socket: client messages are ignored."""

    async def dashboard_event(self, event: dict[str, Any]) -> None:
        await self.send_json({"kind": event["kind"], "payload": event["payload"]})
