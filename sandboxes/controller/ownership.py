"""Who owns a job's sandboxes besides the controller: owner references and job anchors.

Rules a reader must not break (paper §4.4):
* A backend that can name an owner (the Kubernetes provider) gets one per job -- the
  trainer pod when it lives in the sandbox namespace, else the job's anchor object,
  created by the job's first create. A backend without owners (``local``) answers with
  the trainer reference it was given and never uses it.
* The owner is resolved BEFORE the create moves to ``creating``, so a failed lookup sends
  nothing.
* The anchor is deleted when the job is drained (every row deleted), never earlier: the
  garbage collector would take pods still being settled with it.
"""

from __future__ import annotations

import logging

from sandboxes.controller.runtime import JobRuntime
from sandboxes.controller.state import ControllerState
from sandboxes.providers.base import OwnerRef
from sandman_site.errors import ProviderError

log = logging.getLogger(__name__)


class Ownership:
    """Owner references for creates, and the anchor's delete once a job is drained."""

    def __init__(self, state: ControllerState) -> None:
        self._state = state

    async def owner_for(self, rt: JobRuntime) -> OwnerRef | None:
        """The owner a create of this job names (None: the backend names none)."""
        info = rt.info
        trainer = None
        if info.trainer_pod_name and info.trainer_pod_uid:
            trainer = OwnerRef(kind="Pod", name=info.trainer_pod_name, uid=info.trainer_pod_uid)
        return await self._state.provider.owner_for(rt.job_id, trainer)

    async def release_owner(self, rt: JobRuntime) -> bool:
        """Delete the drained job's anchor (a no-op without anchors); False to retry later."""
        try:
            await self._state.provider.delete_anchor(rt.job_id)
        except ProviderError:
            log.warning("anchor of job %s not deleted yet; retried", rt.job_id, exc_info=True)
            return False
        return True
