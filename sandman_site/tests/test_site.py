"""Site-wide endpoints: liveness, JSON errors for unknown paths, Plotly served locally."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.test import Client


@pytest.mark.django_db
def test_healthz_answers_ok_when_the_database_answers(client: Client) -> None:
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"ok": True, "database": True}


@pytest.mark.django_db
def test_unknown_api_path_is_a_json_404(client: Client) -> None:
    response = client.get("/api/v1/no-such-thing/")
    assert response.status_code == 404
    assert response.json()["error"] == "not_found"


def test_plotly_js_is_found_by_staticfiles_from_the_installed_package() -> None:
    from django.contrib.staticfiles import finders

    path = finders.find("plotly/plotly.min.js")
    assert path is not None
    with open(path, "rb") as fh:
        head = fh.read(4096)
    assert b"plotly" in head.lower()


def _fresh_import(
    tmp_path: Path, extra: dict[str, str], probe: str
) -> subprocess.CompletedProcess[str]:
    """``probe`` run after ``import sandman_site.asgi`` in a fresh interpreter (nothing
    other tests imported counts): dev settings on SQLite, no controller, then ``extra``."""
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "sandman_site.settings.dev",
        "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}",
        "SANDMAN_VAR_DIR": str(tmp_path),
        "SANDMAN_CONTROLLER_AUTOSTART": "0",
        **extra,
    }
    return subprocess.run(
        [sys.executable, "-c", "import sandman_site.asgi\n" + probe],
        cwd=Path(__file__).resolve().parents[2],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )


def test_the_asgi_app_imports_what_the_first_requests_need_when_it_is_built(tmp_path: Path) -> None:
    """A worker's first burst of acquires must not wait in its event loop for the imports
    of the views and their schema decorators (``sandman_site.asgi.warm_up``), nor for a
    full collection that walks them (``sandman_site.heap``). A fresh interpreter, so what
    other tests imported does not count."""
    probe = (
        "import gc, sys, sandman_site.asgi\n"
        "from django.conf import settings\n"
        "wanted = [settings.ROOT_URLCONF, 'sandboxes.apis.jobs', 'sandboxes.apis.sandboxes',\n"
        "          'sandboxes.apis.direct', 'drf_spectacular.openapi']\n"
        "print(','.join(m for m in wanted if m not in sys.modules))\n"
        "print(gc.get_freeze_count(), len(gc.get_objects()))\n"
    )
    done = _fresh_import(tmp_path, {}, probe)
    missing, counts = done.stdout.split("\n")[:2]
    assert missing == "", f"not imported at start: {missing}"
    # What the start built is frozen (sandman_site.heap): a full collection in a worker
    # walks only what came after, not the ~170,000 objects of the imports.
    frozen, tracked = map(int, counts.split())
    assert frozen > 50_000 and tracked < frozen // 10, (frozen, tracked)


def test_a_split_worker_builds_its_image_checker_when_the_app_is_built(tmp_path: Path) -> None:
    """A web worker of split processes checks each acquire's image with the backend's
    provider (``RemoteController.image_checker``); built at the app's start, not in the
    event loop of the first acquire. One that cannot be built leaves the start working
    (logged) and is built on first use, as before. Fresh interpreters: nothing of other
    tests counts. The controller's socket is never dialled for this."""
    probe = (
        "from sandboxes.apis.common import controller\n"
        "ctl = controller()\n"
        "print(type(ctl).__name__, getattr(ctl, 'image_checker_built', '-'))\n"
    )
    socket = str(tmp_path / "nobody.sock")
    local = _fresh_import(tmp_path, {"SANDMAN_CONTROLLER_SOCKET": socket}, probe)
    assert local.stdout.split() == ["RemoteController", "True"], local.stderr[-2000:]
    alone = _fresh_import(tmp_path, {"SANDMAN_CONTROLLER_SOCKET": ""}, probe)
    assert alone.stdout.split()[0] == "Controller"  # one process: the controller's own
    broken = _fresh_import(
        tmp_path,
        {
            "SANDMAN_CONTROLLER_SOCKET": socket,
            "SANDMAN_BACKEND": "kubernetes",
            "KUBECONFIG": str(tmp_path / "no-such-kubeconfig"),
            "KUBERNETES_SERVICE_HOST": "",
        },
        probe,
    )
    assert broken.stdout.split() == ["RemoteController", "False"], broken.stderr[-2000:]
    assert "the image checker could not be built at start" in broken.stderr
