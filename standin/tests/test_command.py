"""``python -m standin`` and its ``manage.py standin_cluster`` wrapper serve until SIGTERM
and their kubeconfig reaches the cluster; the wrapper says so when the package is missing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from kubernetes import client
from kubernetes import config as kube_config

REPO = Path(__file__).resolve().parents[2]

COMMANDS = {
    "manage.py": ["manage.py", "standin_cluster"],
    "python-m-standin": ["-m", "standin"],
}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_command_writes_a_kubeconfig_serves_and_stops_on_sigterm(
    tmp_path: Path, command: str
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "sandman_site.settings.test",
        "SANDMAN_VAR_DIR": str(tmp_path),
    }
    proc = subprocess.Popen(
        [
            sys.executable,
            *COMMANDS[command],
            "--port",
            "0",
            "--kubeconfig",
            str(kubeconfig),
            "--nodes",
            "2",
            "--namespace",
            "rehearsal",
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "stand-in cluster listening on http://127.0.0.1:" in line, (
            proc.stderr.read() if not line else line
        )
        configuration = client.Configuration()
        kube_config.load_kube_config(
            config_file=str(kubeconfig), client_configuration=configuration
        )
        api = client.CoreV1Api(client.ApiClient(configuration))
        body = {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "i"}]}}
        assert api.create_namespaced_pod("rehearsal", body).metadata.uid
        assert [p.metadata.name for p in api.list_namespaced_pod("rehearsal").items] == ["p"]
        api.api_client.close()
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0 and "stopped" in out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_the_wrapper_raises_a_command_error_when_the_package_is_not_importable(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """An installed wheel has no ``standin``: the command says so instead of a traceback."""
    monkeypatch.setitem(sys.modules, "standin", None)
    monkeypatch.setitem(sys.modules, "standin.cli", None)
    with pytest.raises(CommandError, match="`standin` package\\) is not importable"):
        call_command("standin_cluster", "--kubeconfig", str(tmp_path / "kubeconfig"))
    assert not (tmp_path / "kubeconfig").exists()
