"""The address watch: reads free pod addresses per subnet and moves the address gate.

Every ``poll_s`` the watch reads its :class:`~sandboxes.addresses.SubnetSource` in a
worker thread (never on the loop), hands the reading to the state's
:class:`~sandboxes.addresses.AddressFloor` and records it (``subnet_samples_record``). A
closing gate wakes every create waiting for its pacer token, which then fails with
``address_floor`` (``creates.py``); the acquires waiting on them answer it.

Rule a reader must not break: a reading that fails (source unreachable, not a
DescribeSubnets document) changes nothing and is logged; the gate keeps its last state.
"""

from __future__ import annotations

import asyncio
import logging

from sandboxes.addresses import SubnetSource
from sandboxes.controller.state import ControllerState
from sandboxes.controller.tasks import TaskOwner
from sandboxes.services.addresses import subnet_samples_record

log = logging.getLogger(__name__)


class AddressWatch:
    def __init__(self, state: ControllerState, tasks: TaskOwner, source: SubnetSource) -> None:
        self._state, self._tasks, self._source = state, tasks, source
        self.readings = 0

    async def poll(self) -> bool:
        """One reading; True if it was taken (and recorded)."""
        try:
            subnets = await asyncio.to_thread(self._source.subnets)
        except (OSError, ValueError) as exc:
            log.warning("reading the subnets' free addresses failed: %s", exc)
            return False
        gate = self._state.addresses
        change = gate.observe(subnets)
        if change is not None:
            log.warning(
                "address floor %s: %s",
                "reached, creates stop" if change.closed else "cleared, creates resume",
                gate.snapshot(),
            )
        self.readings += 1
        await self._tasks.db(
            subnet_samples_record,
            subnets=subnets,
            floor=gate.floor,
            change=change,
            now=self._state.now(),
        )
        return True
