"""URL routes of this app."""

from __future__ import annotations

urlpatterns: list = []
