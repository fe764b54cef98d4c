"""Schemathesis over every operation of the document, against the real service (issue 12
item 1): examples, coverage, fuzzing and stateful phases, 0 failures, with a trainer's
token and with a staff user's.

The service runs as its own daphne process on the test database
(``sandman_site.testing.server``), so the fast path, the middlewares, the error pages and
the controller answer exactly as in production. Bounded: a fixed seed, a few examples per
operation and a time budget (``FUZZ_MAX_TIME_S``), about a minute of CI.

Reproduce by hand: ``schemathesis run http://HOST/api/v1/schema/?format=json
-H 'Authorization: Token KEY' --checks not_a_server_error,status_code_conformance,
content_type_conformance,response_schema_conformance``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sandboxes.tests.api_support import make_job, make_user, seed_sandbox
from sandman_site.testing.server import Served

CHECKS = (
    "not_a_server_error,status_code_conformance,content_type_conformance,"
    "response_schema_conformance"
)
FUZZ_MAX_TIME_S = 60
FUZZ_MAX_EXAMPLES = 15
# An acquire that gets no sandbox within the caller's own ``timeout_s`` answers 504
# ``acquire_timeout`` by design (declared in the document); no other 5xx is accepted.
CONFIG = """
[[operations]]
include-operation-id = "job_acquire"
checks.not_a_server_error.expected-statuses = ["2xx", "3xx", "4xx", "504"]
"""


@pytest.fixture
def seeded(served: Served) -> Served:
    """The trainer owns a job and a handed-out sandbox (the fuzzer reaches id 1)."""
    job = make_job(served.user, name="fuzz-job")
    seed_sandbox(job, hand_out=True)
    return served


def _schemathesis(
    url: str, token: str, config: Path, *extra: str
) -> subprocess.CompletedProcess[str]:
    config.write_text(CONFIG)
    command = [
        sys.executable,
        "-m",
        "schemathesis.cli",
        "--config-file",
        str(config),
        "run",
        f"{url}/api/v1/schema/?format=json",
        "-H",
        f"Authorization: Token {token}",
        "--checks",
        CHECKS,
        "--phases",
        "examples,coverage,fuzzing,stateful",
        "--max-examples",
        str(FUZZ_MAX_EXAMPLES),
        "--max-time",
        str(FUZZ_MAX_TIME_S),
        "--seed",
        "12",
        "--workers",
        "1",
        "--generation-database",
        "none",
        "--no-color",
        "--request-timeout",
        "30",
        *extra,
    ]
    return subprocess.run(  # in tmp_path: Schemathesis keeps a cache in its working directory
        command, capture_output=True, text=True, timeout=FUZZ_MAX_TIME_S * 4, cwd=config.parent
    )


@pytest.mark.parametrize("caller", ["trainer", "staff"])
def test_schemathesis_finds_no_failure_in_any_operation(
    seeded: Served, tmp_path: Path, caller: str
) -> None:
    """As a trainer, and as a staff user (who may also write incidents and import them):
    the same checks, the same bounds."""
    token = seeded.token if caller == "trainer" else make_user("fuzz-staff", staff=True)[1]
    result = _schemathesis(seeded.url, token, tmp_path / "schemathesis.toml")
    summary = result.stdout[-3000:]
    failures = result.stdout.partition("FAILURES")[2][:12000]
    assert result.returncode == 0, failures + summary + "\n--- server log ---\n" + seeded.errors()
    assert "Selected: " in result.stdout and " 0 failures" not in result.stdout
    assert "Traceback" not in seeded.log.read_text()
    tested = [line for line in result.stdout.splitlines() if "Tested:" in line]
    print(summary)
    assert tested, summary
