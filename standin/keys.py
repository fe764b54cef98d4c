"""The pod keys the stand-in cluster reads and writes, as its own literal constants.

The stand-in plays a cluster: it knows label selectors and the pod fields a client sends,
not Sandman. The few keys below are the contract with whatever client drives it -- the
timing stamps its simulated kubelet writes -- so they are spelled out here instead of
imported from the service (``standin/tests/test_isolation.py`` checks that they still
match what Sandman's Kubernetes provider reads). A real execd (``--run-execd``) is started
from the pod's spec alone, so no key says anything about it.

Never change a value here alone: the provider under test reads these names.
"""

from __future__ import annotations

# Timing stamps the simulated kubelet and API server write on pods (RFC 3339,
# microseconds). A real cluster sets none of them.
PREFIX = "standin.sandman.dev/"
CREATED_AT = PREFIX + "created-at"
SCHEDULED_AT = PREFIX + "scheduled-at"
ADDRESS_ASSIGNED_AT = PREFIX + "address-assigned-at"
ADDRESS_FAILURES = PREFIX + "address-failures"
PULLED_AT = PREFIX + "pulled-at"
IMAGE_PRESENT = PREFIX + "image-present"
PULL_MS = PREFIX + "pull-ms"
STARTED_AT = PREFIX + "started-at"
READY_AT = PREFIX + "ready-at"
# Input: the image size in bytes the stand-in uses for a simulated pull.
IMAGE_BYTES = PREFIX + "image-bytes"
