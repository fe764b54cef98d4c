"""The ``local`` backend: sandboxes as isolated execd process trees on this host.

``LocalProvider`` implements ``sandboxes.providers.base.Provider``; ``validate_image`` lets
the REST layer refuse an unknown image (``UnknownImage``, 400) before queueing an acquire.
Module map: ``images`` (image -> workspace), ``isolation`` (bubblewrap launch, guards),
``cgroups`` (limits), ``procs`` (pids, reaping), ``records`` (on-disk record),
``readiness`` / ``teardown`` (wait_ready / destroy: collaborators the provider builds,
each given what it uses), ``locks`` (one create/destroy per name), ``health`` (execd's
health through the one execd client: the one execd call), ``sandbox_init`` (the
sandbox's first process; standard library only).
"""

from __future__ import annotations

from sandboxes.providers.local.images import validate_image
from sandboxes.providers.local.provider import LocalProvider

__all__ = ["LocalProvider", "validate_image"]
