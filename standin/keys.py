"""The pod keys the stand-in cluster reads and writes, as its own literal constants.

The stand-in plays a cluster: it knows label selectors and the pod fields a client sends,
not Sandman. The few keys below are the contract with whatever client drives it -- the
env var that carries a pod's execd token and the annotation that says where a real execd
listens -- so they are spelled out here instead of imported from the service
(``standin/tests/test_isolation.py`` checks that they still match what Sandman's
Kubernetes provider reads). Stage timings are never stamped on pods: the stand-in tells
them as a cluster does, in core/v1 Events (``events.py``).

Never change a value here alone: the provider under test reads these names.
"""

from __future__ import annotations

# The container env var that carries a sandbox's execd token; the kubelet hands it to the
# execd it runs and scrubs it from that execd's environment.
EXECD_TOKEN_ENV = "SANDMAN_EXECD_TOKEN"
# Written on a pod when its real execd listens elsewhere than the configured port.
EXECD_PORT_ANNOTATION = "sandman.dev/execd-port"

# Input a test may put on a pod: the image size in bytes the stand-in uses for a simulated
# pull. Only the stand-in reads it; what happened comes back as core/v1 Events.
IMAGE_BYTES = "standin.sandman.dev/image-bytes"
