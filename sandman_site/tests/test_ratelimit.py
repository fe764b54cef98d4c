"""Per-token request rate of the hot routes (issue 12 item 6): 429 with ``Retry-After``.

The buckets are pure logic with an injected clock (no sleeps); the views and the ASGI
fast path share them, so a caller past its rate gets the view's own 429 on both paths.
"""

from __future__ import annotations

from typing import Any

import pytest
from asgiref.sync import async_to_sync

from sandboxes.apis import access
from sandboxes.tests.api_support import api, make_job, make_user
from sandman_site import ratelimit
from sandman_site.ratelimit import TokenBuckets


class FakeClock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Any:
    clock = FakeClock()
    ratelimit.reset(TokenBuckets(rate_per_s=1.0, burst=2, clock=clock))
    yield clock
    ratelimit.reset()


def test_a_bucket_admits_its_burst_then_one_request_per_refill() -> None:
    clock = FakeClock()
    buckets = TokenBuckets(rate_per_s=2.0, burst=3, clock=clock)
    assert [buckets.take("a") for _ in range(3)] == [0.0, 0.0, 0.0]
    assert buckets.take("a") == pytest.approx(0.5)
    assert buckets.take("b") == 0.0  # another token has its own bucket
    clock.now += 0.25
    assert buckets.take("a") == pytest.approx(0.25)
    clock.now += 0.25
    assert buckets.take("a") == 0.0
    clock.now += 100
    assert [buckets.take("a") for _ in range(4)][-1] > 0  # refills only up to the burst


def test_rate_zero_turns_the_limit_off() -> None:
    buckets = TokenBuckets(rate_per_s=0, burst=1, clock=FakeClock())
    assert all(buckets.take("a") == 0.0 for _ in range(1000))


@pytest.mark.django_db
def test_past_its_rate_a_token_gets_429_with_retry_after_and_others_do_not(clock: Any) -> None:
    owner, token = make_user("hot")
    _, other = make_user("other-hot")
    job = make_job(owner)
    path = f"/api/v1/jobs/{job.pk}/acquire/"
    answers = [api(token).post(path, {}, format="json") for _ in range(3)]
    assert [a.status_code for a in answers] == [400, 400, 429]  # {} is invalid: the view's 400
    refused = answers[2]
    assert refused.json()["error"] == "throttled"
    assert refused["Retry-After"] == "1"
    assert api(other).post(path, {}, format="json").status_code == 404  # its own bucket
    release = api(token).post("/api/v1/sandboxes/1/release/", {}, format="json")
    assert release.status_code == 429  # the same buckets for release
    clock.now += 1.0
    assert api(token).post(path, {}, format="json").status_code == 400


@pytest.mark.django_db(transaction=True)
def test_the_fast_path_hands_a_caller_past_its_rate_to_the_views_429(clock: Any) -> None:
    from sandboxes.apis.fastpath import hot_routes
    from sandboxes.tests.test_api_fastpath import SPEC, Recorder, post

    access.clear()
    owner, token = make_user("hot-fast")
    job = make_job(owner)
    async_to_sync(access.token_user)(token)  # a known token and job: the fast path's own
    ratelimit.hot_route_buckets().take(token)
    ratelimit.hot_route_buckets().take(token)  # its burst is spent
    app = Recorder()
    path = f"/api/v1/jobs/{job.pk}/acquire/"
    body = {"image": "sandman/empty", "spec": SPEC}
    status, headers, answer = async_to_sync(post)(hot_routes(app), path, token, body)
    assert (status, answer["error"]) == (429, "throttled")
    assert headers["retry-after"] == "1"
    assert app.paths == [path]  # Django's view answered, not the fast path
    access.clear()
