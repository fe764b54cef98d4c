"""The one object the controller's collaborators share: what one started controller holds.

Built by ``Controller.start()`` before the loop runs anything and handed to every
collaborator that needs part of it; nothing else is shared between them. Everything in it
is touched on the controller's loop thread only (the facade reads ``reconciled`` and the
cluster queue from other threads, which is a read of a plain attribute).

Rule a reader must not break: a collaborator never stores a second copy of what lives here
(the provider, the runtimes, the in-flight destroys): it reads this object, so a value
changed by one collaborator is the value every other one sees.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from sandboxes.addresses import AddressFloor
from sandboxes.controller.dbexec import DbExecutor
from sandboxes.controller.runtime import JobRuntime
from sandboxes.pacing import TokenBucket
from sandboxes.providers.base import Provider


@dataclass
class ControllerState:
    """The backend, the loop, the database threads, the cluster bucket and per-job books."""

    provider: Provider
    loop: asyncio.AbstractEventLoop
    db: DbExecutor
    cluster: TokenBucket
    clock: Callable[[], float]
    now: Callable[[], dt.datetime]
    sleep: Callable[[float], Awaitable[None]]
    runtimes: dict[int, JobRuntime] = field(default_factory=dict)
    # One destroy per sandbox name in flight (deletes.py).
    destroying: dict[str, asyncio.Task[bool]] = field(default_factory=dict)
    # Set by ``stop()``: in-flight work is abandoned, nothing new is cleaned up.
    stopping: bool = False
    # The database and the backend agreed once (reconcile.py); maintenance retries until so.
    reconciled: bool = False
    # The address gate (sandboxes.addresses): closed, no create is admitted or sent.
    addresses: AddressFloor = field(default_factory=AddressFloor)
    # When this controller started: acquisitions still ``pending`` from before it belong to
    # a controller that is gone (reconcile.py ends them ``failed``, ``service_restarted``).
    since: dt.datetime | None = None
    # Called (loop thread) after pods of a job became warm: the direct hand-out offers them
    # (offers.py), built after the collaborators that make pods warm.
    warm_listeners: list[Callable[[JobRuntime], None]] = field(default_factory=list)

    def became_warm(self, rt: JobRuntime) -> None:
        for listener in self.warm_listeners:
            listener(rt)

    @property
    def backend(self) -> str:
        """The provider's name, as stored on every sandbox row."""
        return self.provider.name
