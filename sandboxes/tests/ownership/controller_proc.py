"""A controller in a process of its own, driven over stdin/stdout, for SIGKILL restart tests.

``python -m sandboxes.tests.ownership.controller_proc`` with the environment:

* ``SANDMAN_TEST_DB_NAME`` -- the test database's NAME (the SQLite file or the PostgreSQL
  test database; everything else comes from the same settings as the test process);
* ``SANDMAN_TEST_K8S_URL`` -- the stand-in cluster's URL (it runs in the test process);
  or ``SANDMAN_TEST_LOCAL_ROOT`` / ``SANDMAN_TEST_LOCAL_IMAGES`` (and optionally
  ``SANDMAN_TEST_LOCAL_ISOLATION``) for the local backend instead;
* ``SANDMAN_TEST_NAMESPACE`` -- the sandbox namespace;
* ``SANDMAN_TEST_WORKERS`` (default 8) -- commands run at once (a burst's concurrency);
* ``SANDMAN_TEST_VERIFY_HEALTH`` (default 1) -- 0 when the stand-in runs no execd.

It prints ``{"ready": true}`` once its controller has started (reconcile done), then
answers one JSON command per stdin line, each in a thread of its own so that an acquire
held by a gate does not block the next command::

    {"id": 1, "op": "acquire", "args": {...controller.acquire kwargs...}}
    {"id": 2, "op": "prewarm", "job_id": 3, "count": 1, "key": {...}}
    {"id": 3, "op": "release", "sandbox_id": 5}
    {"id": 4, "op": "wait_idle"}

Answers: ``{"id": n, "ok": true, "result": {...}}`` or ``{"id": n, "ok": false, "error": s}``.
The test kills it with SIGKILL: nothing here runs at exit, by design.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "sandman_site.settings.test")
    import django
    from django.conf import settings

    settings.DATABASES["default"]["NAME"] = os.environ["SANDMAN_TEST_DB_NAME"]
    django.setup()

    from sandboxes.controller import Controller, PrewarmKey

    provider: Any
    if os.environ.get("SANDMAN_TEST_LOCAL_ROOT"):  # the local backend instead of the stand-in
        from pathlib import Path

        from sandboxes.providers.local import LocalProvider

        provider = LocalProvider(
            root=Path(os.environ["SANDMAN_TEST_LOCAL_ROOT"]),
            images_dir=Path(os.environ["SANDMAN_TEST_LOCAL_IMAGES"]),
            isolation_mode=os.environ.get("SANDMAN_TEST_LOCAL_ISOLATION", "off"),
        )
    else:
        provider = _kubernetes_provider()
    controller = Controller(provider=provider, sweep_interval_s=0, maintenance_interval_s=None)
    controller.start()
    lock = threading.Lock()

    def say(message: dict[str, Any]) -> None:
        with lock:
            sys.stdout.write(json.dumps(message) + "\n")
            sys.stdout.flush()

    def run(command: dict[str, Any]) -> None:
        op = command["op"]
        try:
            if op == "acquire":
                result: Any = dataclasses.asdict(controller.acquire(**command["args"]))
            elif op == "prewarm":
                key = PrewarmKey(count=command["count"], **command["key"])
                controller.prewarm(job_id=command["job_id"], keys=[key])
                result = None
            elif op == "release":
                controller.release(sandbox_id=command["sandbox_id"])
                result = None
            elif op == "wait_idle":
                controller.wait_idle()
                result = None
            else:
                raise ValueError(f"unknown op {op!r}")
        except Exception as exc:  # reported to the test, which decides
            say({"id": command["id"], "ok": False, "error": f"{type(exc).__name__}: {exc}"})
            return
        say({"id": command["id"], "ok": True, "result": result})

    say({"ready": True})
    # acquires in their own pool: a release or prewarm never queues behind a burst of them
    workers = int(os.environ.get("SANDMAN_TEST_WORKERS", "8"))
    with ThreadPoolExecutor(workers) as acquires, ThreadPoolExecutor(8) as others:
        for line in sys.stdin:
            if line.strip():
                command = json.loads(line)
                pool = acquires if command["op"] == "acquire" else others
                pool.submit(run, command)


def _kubernetes_provider() -> Any:
    from sandboxes.providers.kubernetes import (
        KubernetesConfig,
        KubernetesProvider,
        build_api_client,
    )

    config = KubernetesConfig(
        namespace=os.environ["SANDMAN_TEST_NAMESPACE"],
        retry_pending_in_background=False,
        destroy_attempts=1,
        max_workers=8,
        verify_health=os.environ.get("SANDMAN_TEST_VERIFY_HEALTH", "1") == "1",
    )
    return KubernetesProvider(
        config,
        api_client=build_api_client(config, host=os.environ["SANDMAN_TEST_K8S_URL"]),
        backoff=lambda attempt: 0.0,
    )


if __name__ == "__main__":
    main()
