"""The one reader of the process environment for settings.

Every Sandman variable is prefixed ``SANDMAN_``; the standard ones (``DATABASE_URL``,
``KUBECONFIG``) are read as they are. Settings modules call these helpers once at import;
nothing else in the code base reads ``os.environ`` for configuration.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlparse


class ConfigError(ValueError):
    """A configuration variable is set to something we cannot use."""


def env_str(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError as exc:
        raise ConfigError(f"{name} must be an integer, got {raw!r}") from exc


def env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError as exc:
        raise ConfigError(f"{name} must be a number, got {raw!r}") from exc


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    if raw.lower() in {"1", "true", "yes", "on"}:
        return True
    if raw.lower() in {"0", "false", "no", "off"}:
        return False
    raise ConfigError(f"{name} must be a boolean (1/0, true/false), got {raw!r}")


def database_from_url(url: str, *, sqlite_default: Path) -> dict:
    """Translate ``DATABASE_URL`` into a Django ``DATABASES['default']`` entry.

    ``postgres://user:pass@host:port/name`` and ``postgresql://...``; a ``host`` query
    parameter (``?host=/tmp/pgsock``) selects a unix-socket directory. Empty: SQLite file.
    """
    if not url:
        return {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": str(sqlite_default),
            "OPTIONS": {"timeout": 30, "transaction_mode": "IMMEDIATE"},
        }
    parsed = urlparse(url)
    if parsed.scheme in {"sqlite", "sqlite3"}:
        return {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": unquote(parsed.path) or str(sqlite_default),
            "OPTIONS": {"timeout": 30, "transaction_mode": "IMMEDIATE"},
        }
    if parsed.scheme not in {"postgres", "postgresql", "pgsql"}:
        raise ConfigError(f"DATABASE_URL scheme {parsed.scheme!r} is not supported")
    query = {k: v[-1] for k, v in parse_qs(parsed.query).items()}
    host = query.pop("host", None) or (unquote(parsed.hostname) if parsed.hostname else "")
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": unquote(parsed.path.lstrip("/")) or "postgres",
        "USER": unquote(parsed.username or ""),
        "PASSWORD": unquote(parsed.password or ""),
        "HOST": host,
        "PORT": str(parsed.port or ""),
        "CONN_MAX_AGE": 60,
        "CONN_HEALTH_CHECKS": True,
        "OPTIONS": query,
    }
