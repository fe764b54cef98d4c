"""Settings shared by every deployment of Sandman.

Values come from the environment through ``sandman_site.env`` only. Layers on top
(``dev``, ``test``, ``production``) change defaults, never the names.
"""

from __future__ import annotations

from pathlib import Path

import plotly

from sandman_site.env import database_from_url, env_bool, env_float, env_int, env_str

BASE_DIR = Path(__file__).resolve().parent.parent.parent
VAR_DIR = Path(env_str("SANDMAN_VAR_DIR", str(BASE_DIR / "var")))

SECRET_KEY = env_str("SANDMAN_SECRET_KEY", "dev-insecure-sandman-key-change-me")
DEBUG = env_bool("SANDMAN_DEBUG", False)
ALLOWED_HOSTS = [h for h in env_str("SANDMAN_ALLOWED_HOSTS", "*").split(",") if h]

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI / Redoc assets, served as static files
    "channels",
    "sandboxes",
    "grading",
    "incidents",
    "dashboards",
    "rollups",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "sandman_site.dbguard.DatabaseUnavailableMiddleware",
]

ROOT_URLCONF = "sandman_site.urls"
WSGI_APPLICATION = None
ASGI_APPLICATION = "sandman_site.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {
    "default": database_from_url(
        env_str("DATABASE_URL"),
        sqlite_default=VAR_DIR / "sandman.sqlite3",
        # PostgreSQL connection pool per process (psycopg_pool); 0 turns it off.
        pool_max=env_int("SANDMAN_DB_POOL_MAX", 32),
        pool_min=env_int("SANDMAN_DB_POOL_MIN", 4),
        pool_timeout_s=env_float("SANDMAN_DB_POOL_TIMEOUT_S", 10.0),
    )
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "/static/"
STATIC_ROOT = VAR_DIR / "static"
# Plotly's JS comes from the installed package (no CDN): /static/plotly/plotly.min.js
STATICFILES_DIRS = [
    BASE_DIR / "static",
    ("plotly", Path(plotly.__file__).resolve().parent / "package_data"),
]

LOGIN_URL = "/admin/login/"
# A CSRF refusal under /api/ is the API's JSON error; the pages keep Django's own page.
CSRF_FAILURE_VIEW = "sandman_site.views.csrf_failure"

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PAGINATION_CLASS": "sandman_site.pagination.Page",
    # JSON only, bounded (sandman_site.parsers): a form or multipart body is a 415.
    "DEFAULT_PARSER_CLASSES": ["sandman_site.parsers.BoundedJSONParser"],
    "PAGE_SIZE": 100,
    "EXCEPTION_HANDLER": "sandman_site.api_errors.exception_handler",
    "DEFAULT_SCHEMA_CLASS": "sandman_site.openapi.SandmanAutoSchema",
    "UNAUTHENTICATED_USER": None,
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Sandman API",
    "DESCRIPTION": "Sandboxes for agentic RL: jobs, acquisitions, gradings, incidents.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    # The docs page loads its scripts from this server (drf-spectacular-sidecar), no CDN.
    # (No Redoc page: drf-spectacular's Redoc template links Google Fonts.)
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    # Swagger UI would otherwise send the document to validator.swagger.io.
    "SWAGGER_UI_SETTINGS": {"validatorUrl": None, "persistAuthorization": False},
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "sandman_site.openapi.bound_body_integers",
    ],
}
# Limits that protect the API (README "Limits"): body bytes, JSON nesting, page size.
SANDMAN_API_MAX_BODY_BYTES = env_int("SANDMAN_API_MAX_BODY_BYTES", 8 * 1024 * 1024)
SANDMAN_API_MAX_JSON_DEPTH = env_int("SANDMAN_API_MAX_JSON_DEPTH", 32)
SANDMAN_API_MAX_PAGE_SIZE = env_int("SANDMAN_API_MAX_PAGE_SIZE", 1000)
# Per-token rate of the hot routes (acquire, release), per process; 0 turns it off.
SANDMAN_API_HOT_RATE_PER_S = env_float("SANDMAN_API_HOT_RATE_PER_S", 1000.0)
SANDMAN_API_HOT_BURST = env_int("SANDMAN_API_HOT_BURST", 2000)
# How long a process trusts a token it read (the revocation window of every process).
SANDMAN_API_TOKEN_TTL_S = env_float("SANDMAN_API_TOKEN_TTL_S", 1.0)

CHANNEL_LAYERS = {
    "default": (
        {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [env_str("SANDMAN_REDIS_URL")]},
        }
        if env_str("SANDMAN_REDIS_URL")
        else {"BACKEND": "channels.layers.InMemoryChannelLayer"}
    )
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("SANDMAN_LOG_LEVEL", "INFO")},
    # runserver gives this logger its own handler; without this every request logs twice.
    "loggers": {
        "django.channels.server": {"propagate": False},
        # The official elector logs every retry at INFO ("yet to finish lease_duration").
        "leaderelection": {"level": "WARNING"},
    },
}

# --- Sandman ---------------------------------------------------------------------------
SANDMAN_BACKEND = env_str("SANDMAN_BACKEND", "local")
SANDMAN_NAMESPACE = env_str("SANDMAN_NAMESPACE", "sandman")
SANDMAN_KUBECONFIG = env_str("KUBECONFIG")
# Kubernetes backend (sandboxes/providers/kubernetes/).
SANDMAN_EXECD_CARRIER_IMAGE = env_str(
    "SANDMAN_EXECD_CARRIER_IMAGE", "ghcr.io/sandman-rl/execd-carrier:0.1.0"
)
SANDMAN_EXECD_PORT = env_int("SANDMAN_EXECD_PORT", 8700)
SANDMAN_K8S_WORKERS = env_int("SANDMAN_K8S_WORKERS", 16)
SANDMAN_K8S_REQUEST_TIMEOUT_S = env_float("SANDMAN_K8S_REQUEST_TIMEOUT_S", 30.0)
SANDMAN_K8S_WATCH_TIMEOUT_S = env_int("SANDMAN_K8S_WATCH_TIMEOUT_S", 300)
# Off only when rehearsing against a stand-in without real execd (fake pod IPs).
SANDMAN_K8S_VERIFY_HEALTH = env_bool("SANDMAN_K8S_VERIFY_HEALTH", True)
SANDMAN_K8S_WORKSPACE = env_str("SANDMAN_K8S_WORKSPACE", "/workspace")
SANDMAN_K8S_DROP_ALL_CAPABILITIES = env_bool("SANDMAN_K8S_DROP_ALL_CAPABILITIES", False)
# Placement: pods select nodes by a node-pool label (e.g. karpenter.sh/nodepool), never an
# instance type (paper Table A14); SANDMAN_K8S_NODE_POOL is the pool of jobs naming none.
SANDMAN_K8S_NODE_POOL_LABEL = env_str("SANDMAN_K8S_NODE_POOL_LABEL", "sandman.dev/node-pool")
SANDMAN_K8S_NODE_POOL = env_str("SANDMAN_K8S_NODE_POOL", "")
# The cluster's pod and service ranges, excluded (with 169.254.169.254/32) from the egress
# of egress-allowed sandboxes: `manage.py render_networkpolicy` (comma-separated CIDRs).
SANDMAN_K8S_POD_CIDRS = env_str("SANDMAN_K8S_POD_CIDRS", "10.244.0.0/16")
SANDMAN_K8S_SERVICE_CIDRS = env_str("SANDMAN_K8S_SERVICE_CIDRS", "10.96.0.0/12")
SANDMAN_IMAGES_DIR = Path(env_str("SANDMAN_IMAGES_DIR", str(VAR_DIR / "images")))
SANDMAN_SANDBOX_ROOT = Path(env_str("SANDMAN_SANDBOX_ROOT", str(VAR_DIR / "sandboxes")))
# Free pod addresses per subnet (sandboxes.addresses): a URL (http(s):// or file://) of an
# EC2 DescribeSubnets document for the sandbox nodes' subnets (empty: no gauge), read every
# SANDMAN_ADDRESS_POLL_S; under SANDMAN_ADDRESS_FLOOR free addresses in any of them the
# pool creates nothing and acquires answer address_floor (0: no floor).
SANDMAN_SUBNETS_URL = env_str("SANDMAN_SUBNETS_URL", "")
SANDMAN_ADDRESS_FLOOR = env_int("SANDMAN_ADDRESS_FLOOR", 0)
SANDMAN_ADDRESS_POLL_S = env_float("SANDMAN_ADDRESS_POLL_S", 10.0)
SANDMAN_CLUSTER_CREATE_RATE = env_float("SANDMAN_CLUSTER_CREATE_RATE", 50.0)
SANDMAN_CLUSTER_CREATE_BURST = env_int("SANDMAN_CLUSTER_CREATE_BURST", 100)
# Start the controller (pool, reconciliation, sweeps) inside this process.
SANDMAN_CONTROLLER_AUTOSTART = env_bool("SANDMAN_CONTROLLER_AUTOSTART", True)
# Split processes (architecture §3.1): the controller runs in `manage.py run_controller`,
# listening on this Unix socket; ASGI worker processes with it set start no controller and
# send acquires, releases, prewarms and drains there. Empty: the controller runs in-process.
SANDMAN_CONTROLLER_SOCKET = env_str("SANDMAN_CONTROLLER_SOCKET", "")
# The direct hand-out (architecture §3.6, PostgreSQL only): the controller offers never-used
# warm pods in the database and an acquire claims one itself (FOR UPDATE SKIP LOCKED, the
# health check, one commit) before it asks the controller. Off: every acquire asks it.
SANDMAN_DIRECT_HANDOUT = env_bool("SANDMAN_DIRECT_HANDOUT", False)
# run_controller's orderly stop: how long the web workers' calls in flight may still run
# to their answer (within k8s/sandman.yaml's 60 s terminationGracePeriodSeconds).
SANDMAN_CONTROLLER_DRAIN_S = env_float("SANDMAN_CONTROLLER_DRAIN_S", 20.0)
# Replicas on Kubernetes: the one holding this coordination.k8s.io/v1 Lease runs the
# controller (sandman_site/election.py); never on the local backend.
SANDMAN_LEADER_ELECTION = env_bool("SANDMAN_LEADER_ELECTION", True)
SANDMAN_LEASE_NAME = env_str("SANDMAN_LEASE_NAME", "sandman-controller")
SANDMAN_LEASE_NAMESPACE = env_str("SANDMAN_LEASE_NAMESPACE", "")  # empty: SANDMAN_NAMESPACE
SANDMAN_LEASE_DURATION_S = env_int("SANDMAN_LEASE_DURATION_S", 15)
SANDMAN_LEASE_RENEW_DEADLINE_S = env_int("SANDMAN_LEASE_RENEW_DEADLINE_S", 10)
SANDMAN_LEASE_RETRY_PERIOD_S = env_int("SANDMAN_LEASE_RETRY_PERIOD_S", 2)
# This replica's identity in the Lease (the pod name); empty: host name + random suffix.
SANDMAN_REPLICA_ID = env_str("SANDMAN_REPLICA_ID", "")
# With SANDMAN_REPLICA_ID = the pod name: the leader labels its own pod sandman.dev/leader.
SANDMAN_POD_NAMESPACE = env_str("SANDMAN_POD_NAMESPACE", "")
# Serve static files (Plotly, dashboard JS) from the ASGI app itself; turn off when a
# reverse proxy serves STATIC_ROOT.
SANDMAN_SERVE_STATIC = env_bool("SANDMAN_SERVE_STATIC", True)
SANDMAN_SWEEP_INTERVAL_S = env_float("SANDMAN_SWEEP_INTERVAL_S", 30.0)
# How long a sandbox handed to an acquire that a restart cut waits for the retry with the
# same Idempotency-Key (or a renew) before it is taken back (sandboxes/services/recovery.py).
SANDMAN_UNCLAIMED_GRACE_S = env_float("SANDMAN_UNCLAIMED_GRACE_S", 60.0)
# Local backend isolation: "auto" uses bubblewrap where it works, "off" never, "require" fails.
SANDMAN_LOCAL_ISOLATION = env_str("SANDMAN_LOCAL_ISOLATION", "auto")
SANDMAN_EXECD_PYTHON = env_str("SANDMAN_EXECD_PYTHON", "python3")
# The uid/gid a local sandbox's commands run as (bubblewrap drops to it before unsharing).
SANDMAN_LOCAL_SANDBOX_UID = env_int("SANDMAN_LOCAL_SANDBOX_UID", 65534)
SANDMAN_LOCAL_SANDBOX_GID = env_int("SANDMAN_LOCAL_SANDBOX_GID", 65534)

# --- Incident detectors (incidents/detectors.py) ----------------------------------------
# Events older than this are not re-read on each run.
SANDMAN_DETECT_LOOKBACK_S = env_float("SANDMAN_DETECT_LOOKBACK_S", 3600.0)
# Flagged minutes closer than this belong to one case (a flapping outage stays one case).
SANDMAN_DETECT_MERGE_GAP_S = env_float("SANDMAN_DETECT_MERGE_GAP_S", 300.0)
# Pod creates answered 5xx: share of a minute's creates, and a floor of 5xx creates.
SANDMAN_DETECT_CREATE_ERROR_SHARE = env_float("SANDMAN_DETECT_CREATE_ERROR_SHARE", 0.2)
SANDMAN_DETECT_CREATE_ERROR_MIN = env_int("SANDMAN_DETECT_CREATE_ERROR_MIN", 5)
# Address-assignment failures: share of a minute's scheduled sandboxes, and a floor.
SANDMAN_DETECT_ADDRESS_FAILURE_SHARE = env_float("SANDMAN_DETECT_ADDRESS_FAILURE_SHARE", 0.1)
SANDMAN_DETECT_ADDRESS_FAILURE_MIN = env_int("SANDMAN_DETECT_ADDRESS_FAILURE_MIN", 5)
# Acquire timeouts per minute that make a burst.
SANDMAN_DETECT_ACQUIRE_TIMEOUTS_MIN = env_int("SANDMAN_DETECT_ACQUIRE_TIMEOUTS_MIN", 10)
# Pod-cap signals (events + refused acquisitions) of one job that open a case.
SANDMAN_DETECT_POD_CAP_MIN = env_int("SANDMAN_DETECT_POD_CAP_MIN", 1)
# At most this many sandboxes are linked to one detector case (all jobs are linked).
SANDMAN_DETECT_MAX_LINKED_SANDBOXES = env_int("SANDMAN_DETECT_MAX_LINKED_SANDBOXES", 500)
