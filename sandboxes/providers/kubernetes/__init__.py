"""The ``kubernetes`` backend: one pod per sandbox, readiness from ONE list+watch.

``KubernetesProvider`` implements ``sandboxes.providers.base.Provider``. Import the public
names from this package, never from its modules' private helpers.
"""

from __future__ import annotations

from sandboxes.providers.kubernetes.provider import *  # noqa: F403
from sandboxes.providers.kubernetes.provider import __all__  # noqa: F401
