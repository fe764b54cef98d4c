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

# SQLite runs (no DATABASE_URL): a FILE test database in WAL mode, not Django's default
# shared-cache in-memory one. The controller writes from its own threads while a test
# thread reads; shared-cache table locks fail at once ("database table is locked")
# instead of waiting for the busy timeout. One file per test process (parallel runs in
# one tree must not share it); Django removes it when the session ends.
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":  # noqa: F405
    import os as _os
    import tempfile as _tempfile

    DATABASES["default"]["TEST"] = {  # noqa: F405
        "NAME": _os.path.join(_tempfile.gettempdir(), f"sandman-test-{_os.getpid()}.sqlite3")
    }
    DATABASES["default"]["OPTIONS"] = {  # noqa: F405
        **DATABASES["default"].get("OPTIONS", {}),  # noqa: F405
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=OFF;",
    }
