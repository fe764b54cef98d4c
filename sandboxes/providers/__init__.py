"""Sandbox backends. ``get_provider()`` builds the one selected by ``SANDMAN_BACKEND``."""

from __future__ import annotations

from sandboxes.providers.base import Provider


def get_provider(name: str | None = None) -> Provider:
    from django.conf import settings

    backend = name or settings.SANDMAN_BACKEND
    if backend == "local":
        from sandboxes.providers.local import LocalProvider

        return LocalProvider.from_settings()
    if backend == "kubernetes":
        from sandboxes.providers.kubernetes import KubernetesProvider

        return KubernetesProvider.from_settings()
    raise ValueError(f"unknown SANDMAN_BACKEND {backend!r} (local or kubernetes)")
