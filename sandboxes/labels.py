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
# The job's startup script; the downward API puts it in a file execd reads at start.
STARTUP_ANNOTATION = "sandman.dev/startup-script"
ANCHOR_KIND = "ConfigMap"

# --- added for the kubernetes provider and the stand-in cluster -------------------------
# Trainer pods carry TRAINER=true; the NetworkPolicy admits traffic to execd only from them.
TRAINER = "sandman.dev/trainer"
# On the service's own pod while its replica holds the controller's Lease; the trainers'
# Service selects it (docs/architecture.md §4.1).
LEADER = "sandman.dev/leader"
