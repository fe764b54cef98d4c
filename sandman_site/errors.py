"""One error family for Sandman, translated to HTTP once (``sandman_site.api_errors``).

Services and the controller raise these; views never build error responses by hand.
Each subclass names its wire ``code`` and HTTP ``status``. Provider errors are raised
``from`` the client's exception so the cause survives in logs.
"""

from __future__ import annotations

from typing import Any


class SandmanError(Exception):
    code = "sandman_error"
    status = 400

    def __init__(self, message: str, extra: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.extra = dict(extra or {})


class InvalidInput(SandmanError):
    code = "invalid"
    status = 400


class NotFound(SandmanError):
    code = "not_found"
    status = 404


class PermissionDenied(SandmanError):
    code = "forbidden"
    status = 403


class InvalidTransition(SandmanError):
    code = "invalid_transition"
    status = 409


class AlreadyReleased(InvalidTransition):
    code = "already_released"


class SandboxLost(InvalidTransition):
    """The backend lost the sandbox while it was handed out (evicted, node lost, not Ready)."""

    code = "sandbox_lost"


class JobNotActive(SandmanError):
    code = "job_not_active"
    status = 409


class JobNotDrained(SandmanError):
    """A job is deleted only once drained and nothing of it is left."""

    code = "job_not_drained"
    status = 409


class PoolCapReached(SandmanError):
    code = "pod_cap"
    status = 429


class AcquireTimeout(SandmanError):
    code = "acquire_timeout"
    status = 504


class UnknownImage(SandmanError):
    code = "unknown_image"
    status = 400


class ImageNotPinned(SandmanError):
    """A tag-referenced image asked for a warm or reused grading sandbox without the job's
    opt-in: only a digest fixes the image such a sandbox serves (paper §4.3)."""

    code = "image_not_pinned"
    status = 409


class GuardUnavailable(SandmanError):
    """A job asked for a guard (e.g. egress deny) that this backend cannot install."""

    code = "guard_unavailable"
    status = 422


class ProviderError(SandmanError):
    code = "provider_error"
    status = 502


class ProviderConflict(ProviderError):
    """The name is held by a pod we do not own (HTTP 409): never touch it."""

    code = "provider_conflict"
    status = 409


class ProviderForbidden(ProviderError):
    code = "provider_forbidden"
    status = 502


class ProviderInvalid(ProviderError):
    """The backend refused the sandbox's spec (Kubernetes 422 Invalid): final, the caller's
    to fix; the message names the refused fields."""

    code = "provider_invalid"
    status = 422


class ProviderAmbiguous(ProviderError):
    """The create may or may not have been stored (5xx, reset): read back by nonce."""

    code = "provider_ambiguous"
    status = 502


class SandboxNotReady(ProviderError):
    code = "sandbox_not_ready"
    status = 504


class ControllerUnavailable(SandmanError):
    code = "controller_unavailable"
    status = 503
