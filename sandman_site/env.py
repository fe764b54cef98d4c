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


# SQLite: readers never wait for the writer (WAL), commits need no fsync of the database
# file (NORMAL is durable across a process crash, not a power cut), and a locked database
# is waited for (``timeout``, seconds) instead of failing at once.
SQLITE_INIT = "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;"
SQLITE_OPTIONS = {"timeout": 30, "transaction_mode": "IMMEDIATE", "init_command": SQLITE_INIT}


def database_from_url(
    url: str,
    *,
    sqlite_default: Path,
    pool_max: int = 0,
    pool_min: int = 4,
    pool_timeout_s: float = 10.0,
) -> dict:
    """Translate ``DATABASE_URL`` into a Django ``DATABASES['default']`` entry.

    ``postgres://user:pass@host:port/name`` and ``postgresql://...``; a ``host`` query
    parameter (``?host=/tmp/pgsock``) selects a unix-socket directory. Empty: SQLite file.

    PostgreSQL with ``pool_max > 0`` uses Django's psycopg connection pool (at most
    ``pool_max`` connections per process, ``min(pool_min, pool_max)`` kept open) and
    ``CONN_MAX_AGE = 0``, so every request hands its connection back to the pool when it
    ends. Under ASGI each request runs in a thread of its own: without a pool each request
    would open (and leave to the garbage collector) a connection of its own.
    ``pool_max = 0``: no pool, persistent connections (``CONN_MAX_AGE = 60``).
    """
    if not url:
        return {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": str(sqlite_default),
            "OPTIONS": dict(SQLITE_OPTIONS),
        }
    parsed = urlparse(url)
    if parsed.scheme in {"sqlite", "sqlite3"}:
        return {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": unquote(parsed.path) or str(sqlite_default),
            "OPTIONS": dict(SQLITE_OPTIONS),
        }
    if parsed.scheme not in {"postgres", "postgresql", "pgsql"}:
        raise ConfigError(f"DATABASE_URL scheme {parsed.scheme!r} is not supported")
    if pool_max < 0:
        raise ConfigError(f"SANDMAN_DB_POOL_MAX must be 0 (no pool) or more, got {pool_max}")
    query: dict[str, object] = {k: v[-1] for k, v in parse_qs(parsed.query).items()}
    host = query.pop("host", None) or (unquote(parsed.hostname) if parsed.hostname else "")
    # JIT compiles a query whose estimated cost is high; the dashboards' aggregates (rollup
    # unions, generate_series joins) are estimated high and run in milliseconds, and the
    # compile alone took 1.5 s of such a query (bench/dashboards.py). ``?options=`` wins.
    query.setdefault("options", "-c jit=off")
    entry = {
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
    if pool_max:
        # Django refuses persistent connections with a pool; the pool checks a connection
        # before lending it, so CONN_HEALTH_CHECKS has nothing left to do.
        entry["CONN_MAX_AGE"] = 0
        entry["CONN_HEALTH_CHECKS"] = False
        # ``timeout``: how long a request waits for a connection, also while PostgreSQL is
        # down (the pool cannot reconnect); then OperationalError, answered 503 (dbguard.py).
        query["pool"] = {
            "min_size": min(pool_min, pool_max),
            "max_size": pool_max,
            "timeout": pool_timeout_s,
        }
    return entry
