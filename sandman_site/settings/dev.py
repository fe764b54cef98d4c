"""Development: the embedded default (SQLite, local backend), debug on."""

from __future__ import annotations

from sandman_site.env import env_bool

from .base import *  # noqa: F403

DEBUG = env_bool("SANDMAN_DEBUG", True)
