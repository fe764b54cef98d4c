"""The grading page and its JSON/CSV data endpoints over Django's test client."""

from __future__ import annotations

import csv
import io
import json

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from dashboards.pages.grading import CHARTS
from dashboards.tests.factories import make_staff
from dashboards.tests.grading_seed import seed_gradings

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff_client() -> Client:
    client = Client()
    client.force_login(make_staff())
    return client


def test_the_page_asks_anonymous_visitors_to_log_in_as_staff() -> None:
    response = Client().get("/gradings/")
    assert response.status_code == 302
    assert response["Location"].startswith("/admin/login/?next=/gradings/")


def test_the_page_shows_four_live_charts_with_tables_and_is_in_the_nav(
    staff_client: Client,
) -> None:
    seed_gradings()
    response = staff_client.get("/gradings/")
    assert response.status_code == 200
    html = response.content.decode()
    for name in CHARTS:
        assert f'id="chart-{name}"' in html and f'id="table-{name}"' in html
        assert f'href="/gradings/data/{name}.csv?minutes=60"' in html
    assert 'data-refresh-on="grading.state"' in html
    assert '<a href="/gradings/">Gradings</a>' in html
    script = html.split('id="dashboard-data" type="application/json">')[1]
    assert set(json.loads(script.split("</script>")[0])) == set(CHARTS) and len(CHARTS) == 4


def test_verdicts_and_rates_count_gradings_per_bucket_in_the_database(
    staff_client: Client,
) -> None:
    seed_gradings()
    with CaptureQueriesContext(connection) as queries:
        body = staff_client.get("/gradings/data/rates.json?minutes=15").json()
    assert len([q for q in queries if "grading_grading" in q["sql"]]) == 1  # one aggregate
    (row,) = body["rows"]
    named = dict(zip(body["columns"], row, strict=True))
    assert (named["resolved"], named["unresolved"], named["no_verdict"]) == (2, 1, 1)
    assert (named["probe_refused"], named["no_verdict_rate"]) == (1, 0.25)
    assert named["probe_refusal_rate"] == 0.25


def test_acquisition_by_source_and_creates_per_grading(staff_client: Client) -> None:
    job = seed_gradings()
    acq = staff_client.get("/gradings/data/acquisition.json").json()
    by_source = {r[0]: r for r in acq["rows"]}
    assert acq["columns"] == ["source", "n", "p50_ms", "p99_ms"]
    assert [by_source[s][1] for s in ("fresh", "warm", "reused")] == [2, 1, 2]
    assert by_source["fresh"][2] == pytest.approx(5000.0)
    assert by_source["reused"][3] == pytest.approx(49.8)
    creates = staff_client.get("/gradings/data/creates.csv")
    assert creates["Content-Type"].startswith("text/csv")
    rows = list(csv.reader(io.StringIO(creates.content.decode())))
    assert rows[0] == ["job_id", "job_name", "creates", "gradings", "creates_per_grading"]
    assert rows[1] == [str(job.pk), "grade-run", "3", "4", "0.75"]


@pytest.mark.parametrize(
    ("path", "status", "code"),
    [
        ("/gradings/data/verdicts.json?minutes=abc", 400, "invalid"),
        ("/gradings/data/nope.json", 404, "not_found"),
    ],
)
def test_bad_input_gets_a_json_4xx(staff_client: Client, path: str, status: int, code: str):
    response = staff_client.get(path)
    assert response.status_code == status
    assert response.json()["error"] == code and response.json()["detail"]
