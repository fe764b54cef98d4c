"""The one chart filter (``dashboards.filters``): parsed from the URL, applied in SQL, written
back into every link, bad input a JSON 400 that names the parameter."""

from __future__ import annotations

import datetime as dt

import pytest
from django.http import QueryDict
from django.test import Client

from dashboards.filters import DEFAULT_TOP, ChartFilter, parse_filter, top_with_others
from dashboards.selectors import overview as sel
from dashboards.tests.factories import acquisition, at, make_job, make_staff, sandbox
from dashboards.window import window_ending
from sandboxes.models import Acquisition, Sandbox
from sandman_site.errors import InvalidInput

NOW = dt.datetime(2026, 10, 14, 13, 0, tzinfo=dt.UTC)


def parse(query: str) -> ChartFilter:
    return parse_filter(QueryDict(query), now=NOW)


def test_a_blank_query_is_the_last_hour_of_everything() -> None:
    flt = parse("")
    assert flt.window.until == NOW and flt.window.minutes == 60
    assert (flt.job_ids, flt.backend, flt.top, flt.fixed_range) == ((), "", DEFAULT_TOP, False)
    assert flt.query() == "minutes=60"


def test_jobs_backend_top_and_a_fixed_range_round_trip_through_the_query_string() -> None:
    flt = parse("job=3&job=7,3&backend=kubernetes&top=2&from=2026-10-01T00:00&to=2026-10-08T00:00")
    assert flt.job_ids == (3, 7) and flt.backend == "kubernetes" and flt.top == 2
    assert flt.window.since == dt.datetime(2026, 10, 1, tzinfo=dt.UTC)
    assert flt.window.bucket_s == 10800  # 7 days in ≤60 points
    again = parse(flt.query())
    assert again == flt
    assert "minutes" not in flt.query() and "minutes=15" in flt.query(minutes="15")
    assert "from=" not in flt.query(minutes="15")


def test_epoch_seconds_are_a_time_too_and_a_month_is_allowed() -> None:
    flt = parse("from=1790000000&to=1792592000")
    assert flt.window.since.timestamp() == 1790000000 and flt.window.bucket_s == 43200  # 30 days


@pytest.mark.parametrize(
    "query, words",
    [
        ("job=abc", "job must be job ids"),
        ("backend=mars", "backend must be one of"),
        ("top=0", "top must be"),
        ("top=x", "top must be"),
        ("from=yesterday", "from must be an ISO 8601"),
        ("to=2026-10-14T12:00", "from is required"),
        ("from=2026-10-14T12:00&to=2026-10-14T12:00:30", "must span"),
        ("from=2026-01-01T00:00&to=2026-10-14T00:00", "must span"),
        ("minutes=0", "minutes must be"),
    ],
)
def test_bad_parameters_are_refused_naming_what_is_wrong(query: str, words: str) -> None:
    with pytest.raises(InvalidInput, match=words):
        parse(query)


def test_top_with_others_keeps_the_biggest_in_order_and_folds_the_rest() -> None:
    rows = [("a", 1), ("b", 9), ("c", 5), ("d", 2)]
    folded = top_with_others(
        rows, top=2, volume=lambda r: r[1], merge=lambda rest: ("others", sum(r[1] for r in rest))
    )
    assert folded == [("b", 9), ("c", 5), ("others", 3)]
    assert top_with_others(rows, top=4, volume=lambda r: r[1], merge=lambda rest: rest[0]) == rows


@pytest.mark.django_db
def test_jobs_and_backend_narrow_the_queries_and_the_tail_becomes_others() -> None:
    window = window_ending(now=at(minutes=60), minutes=60)
    jobs = [make_job(f"job-{i}") for i in range(4)]
    boxes = []
    for i, job in enumerate(jobs):
        backend = "kubernetes" if i == 0 else "local"
        for n in range(i + 1):
            box = sandbox(job, requested_at=at(minutes=10, seconds=n))
            box.backend = backend
            boxes.append(box)
    Sandbox.objects.bulk_create(boxes)
    for box in Sandbox.objects.all():
        acq = acquisition(box.job, finished_at=at(minutes=20), wait_ms=5.0)
        acq.sandbox = box
        acq.save()
    assert Acquisition.objects.count() == 10
    everything = sel.warm_hits_by_job(ChartFilter(window, top=2))
    assert [r.job_name for r in everything] == ["job-2", "job-3", "others (2 jobs)"]
    assert everything[-1].created == 1 + 2
    only = sel.warm_hits_by_job(ChartFilter(window, job_ids=(jobs[1].pk, jobs[3].pk)))
    assert [(r.job_name, r.created) for r in only] == [("job-1", 2), ("job-3", 4)]
    k8s = ChartFilter(window, backend="kubernetes")
    assert [(r.job_name, r.created) for r in sel.warm_hits_by_job(k8s)] == [("job-0", 1)]
    assert sum(r.creates for r in sel.creates_per_bucket(k8s)) == 1
    assert sum(r.creates for r in sel.creates_per_bucket(ChartFilter(window))) == 10


@pytest.mark.django_db
@pytest.mark.parametrize("page", ["/", "/operations/", "/training/"])
def test_every_chart_page_carries_its_filter_into_its_links_and_answers_400_for_bad_ones(
    page: str,
) -> None:
    client = Client()
    client.force_login(make_staff())
    job = make_job("one")
    html = client.get(f"{page}?job={job.pk}&backend=local&top=3&minutes=15").content.decode()
    query = f"minutes=15&amp;job={job.pk}&amp;backend=local&amp;top=3"
    assert f'data-query="{query}"' in html
    assert f".csv?{query}" in html and f".json?{query}" in html
    assert f"?minutes=60&amp;job={job.pk}&amp;backend=local&amp;top=3" in html  # window links
    assert f'id="filter-job" value="{job.pk}"' in html
    bad = client.get(f"{page}?backend=mars")
    assert bad.status_code == 400
    assert bad.json()["error"] and "backend" in bad.json()["detail"]
    data_url = {"/": "/dashboard/data/", "/operations/": "/operations/data/"}.get(
        page, "/training/data/"
    )
    answer = client.get(f"{data_url}nothing.json?top=99")
    assert answer.status_code == 400 and "top" in answer.json()["detail"]
