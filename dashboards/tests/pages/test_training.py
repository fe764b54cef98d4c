"""The training page (Appendix J, Figure 5) and its JSON/CSV endpoints over Django's client.

Records go in through the real ingest services, placed a few minutes before now (the pages
read the real clock at the edge). The example is the hand-computable one of
``sandboxes/tests/test_critical_path.py``: 40% learner, 30% generation, 10% commands,
8% tests, 6% grading acquisition, 4% other, 2% release.
"""

from __future__ import annotations

import csv
import io
import json
import time
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from dashboards.pages.training import CHARTS
from dashboards.tests.factories import make_job, make_staff
from sandboxes.critical_path import CATEGORIES, LITTLE_CAVEAT
from sandboxes.services.trajectories import learner_steps_report, trajectories_report

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff_client() -> Client:
    client = Client()
    client.force_login(make_staff())
    return client


def phases(t0: float, *items: tuple[str, float, float]) -> list[dict[str, Any]]:
    return [{"kind": k, "start": t0 + a, "end": t0 + b} for k, a, b in items]


def seed_example(name: str = "campaign-a") -> int:
    """The hand-computable example, ending a minute ago; returns the job id."""
    job = make_job(name)
    t0 = time.time() - 260
    a = {"id": "a", "slot": 0, "group": "g1", "start": t0 + 20, "end": t0 + 150}
    a |= {"failed": False, "phases": phases(t0, ("generation", 20, 150))}
    b = {"id": "b", "slot": 1, "group": "g1", "start": t0 + 40, "end": t0 + 158, "failed": False}
    b["phases"] = phases(
        t0,
        ("rollout_acquisition", 40, 45),
        ("generation", 45, 130),
        ("commands", 130, 140),
        ("grading_acquisition", 142, 148),
        ("tests", 148, 156),
        ("release", 156, 158),
    )
    now = timezone.now()
    trajectories_report(job_id=job.pk, records=[a, b], now=now)
    step = {"step": 1, "wait_start": t0 + 100, "wait_end": t0 + 160, "train_end": t0 + 200}
    learner_steps_report(job_id=job.pk, records=[{**step, "groups": ["g1"]}], now=now)
    return job.pk


def test_the_page_asks_anonymous_visitors_to_log_in_as_staff() -> None:
    response = Client().get("/training/")
    assert response.status_code == 302
    assert response["Location"].startswith("/admin/login/?next=/training/")


def test_the_page_shows_five_live_charts_with_csv_and_json_links_and_is_in_the_nav(
    staff_client: Client,
) -> None:
    seed_example()
    html = staff_client.get("/training/").content.decode()
    assert list(CHARTS) == [
        "critical_path",
        "step_shares",
        "waiting_share",
        "estimate",
        "estimate_time",
    ]
    for name in CHARTS:
        assert f'id="chart-{name}"' in html
        assert f'href="/training/data/{name}.csv?minutes=60"' in html
        assert f'href="/training/data/{name}.json?minutes=60"' in html
    assert 'data-data-url="/training/data/"' in html
    assert 'data-refresh-on="trajectories learner_steps"' in html
    assert '<a href="/training/">Training</a>' in html
    assert "cdn" not in html.lower()
    embedded = json.loads(
        html.split('id="dashboard-data" type="application/json">')[1].split("</script>")[0]
    )
    assert set(embedded) == set(CHARTS)


def test_the_figure_5_bars_carry_the_hand_computable_shares(staff_client: Client) -> None:
    job_id = seed_example()
    body = staff_client.get("/training/data/critical_path.json").json()
    assert body["columns"] == ["job_id", "job_name", "steps", *CATEGORIES]
    (row,) = body["rows"]
    shares = dict(zip(body["columns"][3:], row[3:], strict=True))
    assert row[:3] == [job_id, "campaign-a", 1]
    expected = {"learner": 0.4, "generation": 0.3, "commands": 0.1, "tests": 0.08}
    expected |= {"grading_acquisition": 0.06, "other": 0.04, "release": 0.02}
    for category in CATEGORIES:
        assert shares[category] == pytest.approx(expected.get(category, 0.0), abs=1e-9)
    traces = body["figure"]["data"]
    assert [t["orientation"] for t in traces] == ["h"] * len(CATEGORIES)
    assert traces[CATEGORIES.index("learner")]["x"] == [40.0]


def test_per_step_shares_and_the_estimate_with_its_caveat(staff_client: Client) -> None:
    seed_example()
    steps = staff_client.get("/training/data/step_shares.json").json()
    (step,) = steps["rows"]
    assert step[1] == 1 and step[3] == pytest.approx(100.0)
    estimate = staff_client.get("/training/data/estimate.json").json()
    (row,) = estimate["rows"]
    named = dict(zip(estimate["columns"], row, strict=True))
    assert named["measured_interval_s"] == pytest.approx(100.0)
    assert named["estimated_interval_s"] == pytest.approx(2 * 124 / 1.08, abs=5e-3)
    assert named["waiting_share"] == pytest.approx(6 / 108, abs=5e-4)
    assert named["caveat"] == LITTLE_CAVEAT
    names = [t["name"] for t in estimate["figure"]["data"]]
    assert "Little's law estimate (s), not a measurement" in names


def test_each_csv_has_the_rows_of_its_json(staff_client: Client) -> None:
    seed_example()
    for name in CHARTS:
        as_json = staff_client.get(f"/training/data/{name}.json").json()
        response = staff_client.get(f"/training/data/{name}.csv")
        assert response["Content-Type"].startswith("text/csv")
        table = list(csv.reader(io.StringIO(response.content.decode())))
        assert table[0] == as_json["columns"]
        assert len(table) == 1 + len(as_json["rows"])
        if name in ("critical_path", "step_shares", "estimate", "waiting_share"):
            assert len(as_json["rows"]) >= 1


def test_an_empty_window_draws_every_trace_empty(staff_client: Client) -> None:
    for name in CHARTS:
        body = staff_client.get(f"/training/data/{name}.json").json()
        assert body["rows"] == []
        assert body["figure"]["data"]
        assert body["figure"]["layout"]["annotations"][0]["text"] == "No data in this window"


def test_a_stored_batch_publishes_a_live_event_after_commit(
    monkeypatch: pytest.MonkeyPatch, django_capture_on_commit_callbacks: Any
) -> None:
    from sandman_site import live

    sent: list[tuple[str, dict]] = []
    monkeypatch.setattr(live, "publish", lambda kind, payload: sent.append((kind, payload)))
    with django_capture_on_commit_callbacks(execute=True):
        job_id = seed_example()
    assert [(kind, p["job_id"], p["stored"]) for kind, p in sent] == [
        ("trajectories", job_id, 2),
        ("learner_steps", job_id, 1),
    ]
