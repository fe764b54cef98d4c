"""Every write to jobs, sandboxes, acquisitions and pending deletes (HackSoft services).

Functions are ``<entity>_<action>`` with keyword-only arguments and a ``now`` parameter;
each runs one short transaction, locks the rows whose state it changes
(``select_for_update``) and publishes to the dashboards only after commit
(``transaction.on_commit`` → ``sandman_site.live.publish``). The controller calls them from
worker threads, never from its event loop thread.
"""

from __future__ import annotations

from sandboxes.services.acquisitions import (
    acquisition_finish,
    acquisition_open_many,
    acquisition_record,
    acquisition_start,
    acquisitions_close_unanswered,
)
from sandboxes.services.batch import sandbox_hand_out
from sandboxes.services.batch_deletes import (
    sandbox_begin_delete,
    sandbox_release_and_begin_delete,
)
from sandboxes.services.deletes import (
    DeleteOrder,
    delete_backoff_s,
    pending_delete_confirmed,
    pending_delete_failed,
    pending_delete_for_unknown,
)
from sandboxes.services.jobs import job_create, job_mark_drained, job_mark_draining
from sandboxes.services.sandboxes import (
    sandbox_fail,
    sandbox_mark_creating,
    sandbox_mark_gone,
    sandbox_mark_healthy,
    sandbox_mark_lost,
    sandbox_mark_ready,
    sandbox_record_event,
    sandbox_record_handle,
    sandbox_release,
    sandbox_request,
    sandbox_return_for_reuse,
    sandbox_transition,
)

__all__ = [
    "DeleteOrder",
    "acquisition_finish",
    "acquisition_open_many",
    "acquisition_record",
    "acquisition_start",
    "acquisitions_close_unanswered",
    "delete_backoff_s",
    "job_create",
    "job_mark_drained",
    "job_mark_draining",
    "pending_delete_confirmed",
    "pending_delete_failed",
    "pending_delete_for_unknown",
    "sandbox_begin_delete",
    "sandbox_fail",
    "sandbox_hand_out",
    "sandbox_mark_creating",
    "sandbox_mark_gone",
    "sandbox_mark_lost",
    "sandbox_mark_healthy",
    "sandbox_mark_ready",
    "sandbox_record_event",
    "sandbox_record_handle",
    "sandbox_release",
    "sandbox_release_and_begin_delete",
    "sandbox_request",
    "sandbox_return_for_reuse",
    "sandbox_transition",
]
