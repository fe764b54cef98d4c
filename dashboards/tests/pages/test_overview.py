"""The dashboard page and its JSON/CSV data endpoints over Django's test client.

Rows come from the pool's real services (``sandbox_request`` … ``sandbox_mark_ready``)
with times in the last hour, since the pages read the real clock at the edge.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import json

import pytest
from django.contrib.auth import get_user_model
from django.contrib.staticfiles import finders
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from dashboards.pages.overview import CHARTS
from dashboards.tests.factories import (
    job_through_services,
    make_staff,
    ready_through_services,
)

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff_client() -> Client:
    client = Client()
    client.force_login(make_staff())
    return client


def _seed(count: int, job_name: str = "run") -> None:
    owner, _ = get_user_model().objects.get_or_create(username="trainer")
    job = job_through_services(job_name, owner)
    now = timezone.now()
    for i in range(count):
        ready_at = now - dt.timedelta(minutes=5, seconds=i)
        ready_through_services(
            job,
            requested_at=ready_at - dt.timedelta(milliseconds=1500 + 100 * i),
            ready_at=ready_at,
            image_present=bool(i % 2),
        )


def test_the_page_asks_anonymous_visitors_to_log_in_as_staff() -> None:
    response = Client().get("/")
    assert response.status_code == 302
    assert response["Location"].startswith("/admin/login/?next=/")


def test_the_page_shows_every_chart_with_its_csv_link_and_local_plotly(
    staff_client: Client,
) -> None:
    _seed(3)
    response = staff_client.get("/")
    assert response.status_code == 200
    html = response.content.decode()
    for name in CHARTS:
        assert f'id="chart-{name}"' in html
        assert f'href="/dashboard/data/{name}.csv?minutes=60"' in html
    assert 'src="/static/plotly/plotly.min.js"' in html
    assert "cdn" not in html.lower()
    script = html.split('id="dashboard-data" type="application/json">')[1]
    embedded = json.loads(script.split("</script>")[0])
    assert set(embedded) == set(CHARTS)
    # Rows are [bucket_start, n, p50, p90, p99]; the three may straddle a minute.
    assert sum(row[1] for row in embedded["ready_time"]["rows"]) == 3


def test_plotly_and_the_dashboard_script_are_served_from_this_installation() -> None:
    for path in ("plotly/plotly.min.js", "sandman/dashboard.js", "sandman/dashboard.css"):
        assert finders.find(path), path


def test_chart_json_has_the_figure_and_the_table_of_ready_sandboxes(staff_client: Client) -> None:
    _seed(4)
    response = staff_client.get("/dashboard/data/ready_split.json?minutes=15")
    assert response.status_code == 200
    body = response.json()
    assert body["chart"] == "ready_split"
    assert body["window"]["minutes"] == 15 and body["window"]["bucket_s"] == 15
    assert body["columns"] == ["image", "n", "p50_ms", "p90_ms", "p99_ms"]
    by_image = {row[0]: row for row in body["rows"]}
    # Present: i = 1, 3 → 1600 and 1800 ms; pulled: i = 0, 2 → 1500 and 1700 ms.
    assert by_image["present"][1:3] == [2, pytest.approx(1700, abs=1)]
    assert by_image["pulled"][1:3] == [2, pytest.approx(1600, abs=1)]
    assert [t["name"] for t in body["figure"]["data"]][:2] == ["present (n=2)", "pulled (n=2)"]


def test_chart_csv_is_a_download_with_the_same_rows_as_the_json(staff_client: Client) -> None:
    _seed(2)
    as_json = staff_client.get("/dashboard/data/states.json").json()
    response = staff_client.get("/dashboard/data/states.csv")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/csv")
    assert response["Content-Disposition"].startswith('attachment; filename="sandman-states-')
    rows = list(csv.reader(io.StringIO(response.content.decode())))
    assert rows[0] == as_json["columns"] == ["state", "count"]
    assert {r[0]: int(r[1]) for r in rows[1:]}["ready"] == 2


@pytest.mark.parametrize(
    ("path", "status", "code"),
    [
        ("/dashboard/data/ready_time.json?minutes=abc", 400, "invalid"),
        ("/dashboard/data/ready_time.json?minutes=0", 400, "invalid"),
        ("/dashboard/data/ready_time.csv?minutes=99999999999999999999", 400, "invalid"),
        ("/dashboard/data/no_such_chart.json", 404, "not_found"),
        ("/?minutes=-5", 400, "invalid"),
    ],
)
def test_bad_input_gets_a_json_4xx_with_error_and_detail(
    staff_client: Client, path: str, status: int, code: str
) -> None:
    response = staff_client.get(path)
    assert response.status_code == status
    body = response.json()
    assert body["error"] == code
    assert isinstance(body["detail"], str) and body["detail"]


def test_data_endpoints_answer_json_401_403_and_405_instead_of_a_login_page() -> None:
    anonymous = Client().get("/dashboard/data/states.json")
    assert (anonymous.status_code, anonymous.json()["error"]) == (401, "not_authenticated")
    trainer = Client()
    trainer.force_login(get_user_model().objects.create_user(username="t", password="pw"))
    forbidden = trainer.get("/dashboard/data/states.csv")
    assert (forbidden.status_code, forbidden.json()["error"]) == (403, "forbidden")
    staff = Client()
    staff.force_login(make_staff())
    posted = staff.post("/dashboard/data/states.json")
    assert (posted.status_code, posted.json()["error"]) == (405, "method_not_allowed")


def test_the_page_costs_the_same_queries_for_one_sandbox_or_many(staff_client: Client) -> None:
    _seed(1, "small")
    with CaptureQueriesContext(connection) as few:
        assert staff_client.get("/").status_code == 200
    _seed(12, "big")
    with CaptureQueriesContext(connection) as many:
        assert staff_client.get("/").status_code == 200
    assert len(many) == len(few)
