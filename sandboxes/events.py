"""Names of SandboxEvent kinds: the timeline vocabulary the dashboards and detectors read.

Writers (services, controller) use these constants only; readers (dashboard selectors,
incident detectors) filter on them. Renaming one silently blinds a dashboard or a
detector, so add new kinds, never rename.

``detail`` conventions: ``CREATE_ERROR`` carries ``{"status": <http status or 0>,
"error": str}``; ``ADDRESS_FAILURE`` carries ``{"node": str, "count": int}``;
``SWEEP_OWNERLESS`` is recorded on a placeholder-free basis through
``incidents`` (no sandbox row exists for an ownerless pod): see ``OwnerlessPod``.
"""

from __future__ import annotations

STATE = "state"  # detail: {"from": str, "to": str}
CREATE_SENT = "create_sent"
CREATE_ERROR = "create_error"
API_CREATED = "api_created"
SCHEDULED = "scheduled"
ADDRESS_ASSIGNED = "address_assigned"
ADDRESS_FAILURE = "address_failure"
IMAGE_PULLED = "image_pulled"
IMAGE_PRESENT = "image_present"
STARTED = "started"
READY = "ready"
HEALTHY = "healthy"
HEALTH_FAILED = "health_failed"
ACQUIRED = "acquired"
RELEASED = "released"
RECLAIMED = "reclaimed"  # lifetime limit reached, taken back from the agent
DELETE_SENT = "delete_sent"
DELETE_FAILED = "delete_failed"
DELETED = "deleted"
ADOPTED = "adopted"  # found at start-up and known to the database
# in use, handed to an acquire a restart cut, claimed by no retry within the grace
UNCLAIMED = "unclaimed_after_restart"
# in use, handed out after its acquire had ended (cancelled, timed out), its controller
# stopped before the delete that follows such a hand-out: taken back by the next one
UNANSWERED = "unanswered_hand_out"
POD_CAP = "pod_cap"
ACQUIRE_TIMEOUT = "acquire_timeout"
# Added by the pool/controller (never rename):
BACKEND_GONE = "backend_gone"  # reconcile found no backend sandbox for a live row
WARM = "warm"  # detail: {"late": bool} — kept as a never-used warm pod
TRIMMED = "trimmed"  # warm pod of a key idle past the job's idle timeout
EVICTED = "evicted"  # warm pod of another key deleted to admit an acquire at max_live
REUSE_CHECKED = "reuse_checked"  # detail: {"ok": bool, "reason": str, "duration_ms": float}
RETIRED = "retired"  # checked-reuse pod retired: max uses, no verdict or contradiction
DRAINED = "drained"  # deleted because its job drains
LOST = "lost"  # detail: {"reason", "message"} the backend lost a Ready/in-use sandbox
STATE_BASELINE = "state_baseline"  # detail: {"ok": bool, ...} checked-reuse baseline taken
