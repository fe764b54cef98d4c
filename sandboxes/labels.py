"""Every label and annotation key Sandman puts on what it creates, in one place.

A pod that carries ``MANAGED_BY=VALUE_MANAGED_BY`` is Sandman's; the sweep and the
reconciler only ever touch pods that carry it. Never rename these: running clusters
hold pods labelled with them.
"""

from __future__ import annotations

MANAGED_BY = "app.kubernetes.io/managed-by"
VALUE_MANAGED_BY = "sandman"
JOB = "sandman.dev/job"
ROLE = "sandman.dev/role"
KEY = "sandman.dev/key"
SANDBOX = "sandman.dev/sandbox"
EGRESS = "sandman.dev/egress"
# Set when a sandbox is handed to an agent: a late pod carrying it is never made warm.
AGENT = "sandman.dev/agent"
NONCE_ANNOTATION = "sandman.dev/nonce"
ANCHOR_KIND = "ConfigMap"

# --- added for the kubernetes provider and the stand-in cluster -------------------------
# Trainer pods carry TRAINER=true; the NetworkPolicy admits traffic to execd only from them.
TRAINER = "sandman.dev/trainer"
# Timing stamps the stand-in cluster writes on pods (RFC 3339, microseconds). A real
# cluster sets none; the provider then falls back to the pod's conditions.
STANDIN_PREFIX = "standin.sandman.dev/"
STANDIN_CREATED_AT = STANDIN_PREFIX + "created-at"
STANDIN_SCHEDULED_AT = STANDIN_PREFIX + "scheduled-at"
STANDIN_ADDRESS_ASSIGNED_AT = STANDIN_PREFIX + "address-assigned-at"
STANDIN_ADDRESS_FAILURES = STANDIN_PREFIX + "address-failures"
STANDIN_PULLED_AT = STANDIN_PREFIX + "pulled-at"
STANDIN_IMAGE_PRESENT = STANDIN_PREFIX + "image-present"
STANDIN_PULL_MS = STANDIN_PREFIX + "pull-ms"
STANDIN_STARTED_AT = STANDIN_PREFIX + "started-at"
STANDIN_READY_AT = STANDIN_PREFIX + "ready-at"
# Input: the image size in bytes the stand-in uses for a simulated pull.
STANDIN_IMAGE_BYTES = STANDIN_PREFIX + "image-bytes"
