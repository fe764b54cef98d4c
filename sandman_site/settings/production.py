"""Production: secrets only from the environment, PostgreSQL required."""

from __future__ import annotations

import os

from sandman_site.env import ConfigError

from .base import *  # noqa: F403
from .base import DATABASES

DEBUG = False
if "SANDMAN_SECRET_KEY" not in os.environ:
    raise ConfigError("SANDMAN_SECRET_KEY must be set in production")
SECRET_KEY = os.environ["SANDMAN_SECRET_KEY"]
if DATABASES["default"]["ENGINE"] != "django.db.backends.postgresql":
    raise ConfigError("production needs DATABASE_URL pointing at PostgreSQL")
SESSION_COOKIE_SECURE = True
CSRF_COOKIE_SECURE = True
