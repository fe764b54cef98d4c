"""The operations page and its JSON/CSV data endpoints over Django's test client.

Rows are written with times in the last hour (the pages read the real clock at the edge);
incidents come from the paper fixture (Table A49).
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import json

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from dashboards.pages.operations import CHARTS
from dashboards.tests.factories import acquisition, make_job, make_staff, sandbox
from sandboxes.models import Acquisition, AddressFloorChange, Sandbox, SubnetSample

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff_client() -> Client:
    client = Client()
    client.force_login(make_staff())
    return client


def _seed(count: int, job_name: str = "run") -> None:
    job = make_job(job_name)
    now = timezone.now()
    requested = now - dt.timedelta(minutes=5)
    Sandbox.objects.bulk_create(
        sandbox(
            job,
            requested_at=requested,
            scheduled_at=requested,
            ready_after_ms=1000,
            node="n1",
            address_failures=i % 3,
            source="warm" if i % 2 else "",
            acquired_at=(requested + dt.timedelta(minutes=1)) if i % 2 else None,
        )
        for i in range(count)
    )
    Acquisition.objects.bulk_create(
        acquisition(job, finished_at=now - dt.timedelta(minutes=2), wait_ms=5, source=source)
        for source in ["warm"] * count + ["created"]
    )


def test_the_page_asks_anonymous_visitors_to_log_in_as_staff() -> None:
    response = Client().get("/operations/")
    assert response.status_code == 302
    assert response["Location"].startswith("/admin/login/?next=/operations/")


def test_the_page_shows_four_charts_with_csv_and_json_links_and_is_in_the_nav(
    staff_client: Client,
) -> None:
    _seed(3)
    call_command("loaddata", "paper_cases", verbosity=0)
    response = staff_client.get("/operations/")
    assert response.status_code == 200
    html = response.content.decode()
    assert len(CHARTS) == 4
    for name in CHARTS:
        assert f'id="chart-{name}"' in html
        assert f'id="table-{name}"' in html
        assert f'href="/operations/data/{name}.csv?minutes=60"' in html
        assert f'href="/operations/data/{name}.json?minutes=60"' in html
    assert 'data-data-url="/operations/data/"' in html
    assert 'data-refresh-on="incident_opened' in html
    assert '<a href="/operations/">Operations</a>' in html
    assert 'src="/static/plotly/plotly.min.js"' in html and "cdn" not in html.lower()
    script = html.split('id="dashboard-data" type="application/json">')[1]
    embedded = json.loads(script.split("</script>")[0])
    assert set(embedded) == set(CHARTS)
    assert len(embedded["incident_hours"]["rows"]) == 6
    # The overview's nav shows the new page too.
    assert '<a href="/operations/">Operations</a>' in staff_client.get("/").content.decode()


def test_warm_use_json_has_hit_rate_and_idle_hours_per_job_and_key(staff_client: Client) -> None:
    _seed(4)
    response = staff_client.get("/operations/data/warm_use.json?minutes=15")
    assert response.status_code == 200
    body = response.json()
    assert body["chart"] == "warm_use" and body["window"]["minutes"] == 15
    assert body["columns"][:6] == [
        "job_id",
        "job_name",
        "key_hash",
        "hits",
        "acquisitions",
        "hit_rate",
    ]
    (row,) = body["rows"]
    # 4 warm + 1 created acquisitions; two sandboxes handed out warm after 59 s idle, two
    # still warm since Ready 4 min 59 s ago.
    assert row[3:7] == [4, 5, 0.8, 4]
    assert row[7] == pytest.approx((2 * 59 + 2 * 299) / 3600, abs=0.002)


def test_free_addresses_chart_has_the_lowest_reading_per_subnet_and_the_floor_changes(
    staff_client: Client,
) -> None:
    """The address floor's event on the dashboard (sandboxes.addresses): where the pool
    stopped creating, and each subnet's lowest free count per bucket."""
    now = timezone.now()
    at = now - dt.timedelta(minutes=3)
    SubnetSample.objects.bulk_create(
        [
            SubnetSample(at=at, subnet_id="subnet-a", zone="zone-a", available=40, floor=20),
            SubnetSample(at=at + dt.timedelta(seconds=5), subnet_id="subnet-a", zone="zone-a",
                         available=12, floor=20),
            SubnetSample(at=at, subnet_id="subnet-b", zone="zone-b", available=300, floor=20),
        ]
    )  # fmt: skip
    AddressFloorChange.objects.create(
        at=at + dt.timedelta(seconds=5), closed=True, subnet_id="subnet-a", available=12,
        floor=20,
    )  # fmt: skip
    body = staff_client.get("/operations/data/free_addresses.json?minutes=60").json()
    assert body["columns"] == ["bucket_start", "bucket_s", "subnet_id", "zone",
                               "min_available", "floor"]  # fmt: skip
    lows = {row[2]: row[4] for row in body["rows"]}
    assert lows == {"subnet-a": 12, "subnet-b": 300}
    traces = {t["name"]: t for t in body["figure"]["data"]}
    assert set(traces) == {"subnet-a (zone-a)", "subnet-b (zone-b)", "floor",
                           "creates stopped / resumed"}  # fmt: skip
    (stopped,) = traces["creates stopped / resumed"]["text"]
    assert stopped.startswith("stopped: subnet-a 12 free (floor 20)")


def test_address_failure_csv_is_a_download_with_the_same_rows_as_the_json(
    staff_client: Client,
) -> None:
    _seed(3)
    as_json = staff_client.get("/operations/data/address_failures.json").json()
    response = staff_client.get("/operations/data/address_failures.csv")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/csv")
    assert response["Content-Disposition"].startswith(
        'attachment; filename="sandman-address_failures-'
    )
    rows = list(csv.reader(io.StringIO(response.content.decode())))
    assert rows[0] == as_json["columns"]
    views = [r[0] for r in rows[1:]]
    assert views == ["per_minute", "by_node_load"]
    assert rows[2][2:5] == ["3", "3", "3"]  # load 3 on n1: 3 sandboxes, 0+1+2 failures


@pytest.mark.parametrize(
    ("path", "status", "code"),
    [
        ("/operations/data/warm_use.json?minutes=abc", 400, "invalid"),
        ("/operations/data/warm_use.csv?minutes=0", 400, "invalid"),
        ("/operations/data/ready_time.json", 404, "not_found"),
        ("/operations/?minutes=-5", 400, "invalid"),
    ],
)
def test_bad_input_gets_a_json_4xx_with_error_and_detail(
    staff_client: Client, path: str, status: int, code: str
) -> None:
    response = staff_client.get(path)
    assert response.status_code == status
    body = response.json()
    assert body["error"] == code and body["detail"]


def test_data_endpoints_answer_json_401_403_and_405_instead_of_a_login_page() -> None:
    anonymous = Client().get("/operations/data/incident_hours.json")
    assert (anonymous.status_code, anonymous.json()["error"]) == (401, "not_authenticated")
    trainer = Client()
    trainer.force_login(get_user_model().objects.create_user(username="t", password="pw"))
    forbidden = trainer.get("/operations/data/incident_hours.csv")
    assert (forbidden.status_code, forbidden.json()["error"]) == (403, "forbidden")
    staff = Client()
    staff.force_login(make_staff())
    posted = staff.post("/operations/data/warm_use.json")
    assert (posted.status_code, posted.json()["error"]) == (405, "method_not_allowed")


def test_the_page_costs_the_same_queries_for_few_rows_or_many(staff_client: Client) -> None:
    _seed(1, "small")
    with CaptureQueriesContext(connection) as few:
        assert staff_client.get("/operations/").status_code == 200
    _seed(12, "big")
    call_command("loaddata", "paper_cases", verbosity=0)
    with CaptureQueriesContext(connection) as many:
        assert staff_client.get("/operations/").status_code == 200
    assert len(many) == len(few)
