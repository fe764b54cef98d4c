"""A client generated from the document by a standard generator drives the real service
(issue 12 item 1): register a job, acquire, release, list.

``openapi-python-client`` (from PyPI) generates the client at test time into
``tmp_path`` from the document the running service serves; the test then imports that
package and uses only it (httpx underneath) against the service in its own process, whose
controller creates a real sandbox on the local backend. A document that lies about a
body, a page envelope or an error answer breaks the generated models here.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

from sandman_site.testing.server import Served


def _generate(served: Served, into: Path) -> None:
    schema = into / "openapi.json"
    request = urllib.request.Request(
        f"{served.url}/api/v1/schema/?format=json",
        headers={"Authorization": f"Token {served.token}"},
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        schema.write_bytes(answer.read())
    bin_dir = str(Path(sys.executable).parent)  # the generator formats with ruff from here
    result = subprocess.run(
        [sys.executable, "-m", "openapi_python_client", "generate"]
        + ["--path", str(schema), "--output-path", str(into / "sandman_client"), "--meta", "none"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}"},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Warning" not in result.stdout, result.stdout


def test_a_generated_client_registers_acquires_releases_and_lists(
    served: Served, tmp_path: Path
) -> None:
    _generate(served, tmp_path)
    sys.path.insert(0, str(tmp_path))
    try:
        client_mod = importlib.import_module("sandman_client")
        jobs = importlib.import_module("sandman_client.api.jobs")
        sandboxes = importlib.import_module("sandman_client.api.sandboxes")
        models = importlib.import_module("sandman_client.models")
        for name in ("job_create", "job_acquire", "job_list"):
            importlib.import_module(f"sandman_client.api.jobs.{name}")
        for name in ("sandbox_release", "sandbox_list"):
            importlib.import_module(f"sandman_client.api.sandboxes.{name}")

        client = client_mod.AuthenticatedClient(
            base_url=served.url, token=served.token, prefix="Token", timeout=120.0
        )
        job = jobs.job_create.sync(
            client=client,
            body=models.JobCreateInput(name="generated-client", egress=models.EgressEnum.DENY),
        )
        assert isinstance(job, models.JobOutput), job
        acquired = jobs.job_acquire.sync(
            job.id,
            client=client,
            body=models.AcquireInput(
                image="sandman/empty", spec=models.Spec(cpu="1", memory="1Gi"), timeout_s=90
            ),
        )
        assert isinstance(acquired, models.AcquireOutput), acquired
        assert acquired.token and acquired.address

        released = sandboxes.sandbox_release.sync(
            acquired.sandbox_id, client=client, body=models.ReleaseInput()
        )
        assert isinstance(released, models.ReleaseOutput), released
        assert released.released is True

        page = jobs.job_list.sync(client=client, limit=10)
        assert isinstance(page, models.PaginatedJobOutputList), page
        assert [j.id for j in page.results] == [job.id] and page.count == 1
        listed = sandboxes.sandbox_list.sync(client=client, job=job.id)
        assert isinstance(listed, models.PaginatedSandboxOutputList), listed
        assert acquired.sandbox_id in [s.id for s in listed.results]

        missing = jobs.job_acquire.sync(
            job.id + 1000,
            client=client,
            body=models.AcquireInput(
                image="sandman/empty", spec=models.Spec(cpu="1", memory="1Gi")
            ),
        )
        assert isinstance(missing, models.Error) and missing.error == "not_found"
    finally:
        sys.path.remove(str(tmp_path))
        for module in [m for m in sys.modules if m.split(".")[0] == "sandman_client"]:
            del sys.modules[module]
