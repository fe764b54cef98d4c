"""The pod keys the stand-in cluster reads and writes, as its own literal constants.

The stand-in plays a cluster: it knows label selectors and the pod fields a client sends,
not Sandman. The few keys below are the contract with whatever client drives it -- the
input a test may put on a pod -- so it is spelled out here instead of imported from the
service. Stage timings are never stamped on pods: the stand-in tells them as a cluster
does, in core/v1 Events (``events.py``). A real execd (``--run-execd``) is started from the
pod's spec alone, so no key says anything about it.

Never change a value here alone: the provider under test reads these names.
"""

from __future__ import annotations

# Input a test may put on a pod: the image size in bytes the stand-in uses for a simulated
# pull. Only the stand-in reads it; what happened comes back as core/v1 Events.
IMAGE_BYTES = "standin.sandman.dev/image-bytes"
