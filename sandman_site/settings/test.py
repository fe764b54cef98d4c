"""Tests: PostgreSQL when DATABASE_URL is set (CI always sets it), else SQLite.

The controller never autostarts here; tests start the pieces they need and stop them.
"""

from __future__ import annotations

from .base import *  # noqa: F403
from .base import VAR_DIR

DEBUG = False
SANDMAN_CONTROLLER_AUTOSTART = False
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
SANDMAN_SANDBOX_ROOT = VAR_DIR / "test-sandboxes"
