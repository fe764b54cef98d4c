"""``sandboxes.apis.access``'s token map: a token revoked anywhere stops working within
1 s in every process (issue 13 item 6), with the clock injected (no wall-time sleeps).

"Anywhere" is modelled by a revocation this process gets no signal for: the row is
deleted with raw SQL, as another process's delete looks from here. ``async_to_sync``
runs the map's database reads in this test's thread (its connection is the test's).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest
from asgiref.sync import async_to_sync
from django.db import connection
from rest_framework.exceptions import AuthenticationFailed

from sandboxes.apis import access
from sandboxes.tests.api_support import make_user

pytestmark = pytest.mark.django_db(transaction=True)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _revoke_elsewhere(key: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM authtoken_token WHERE key = %s", [key])


def test_the_token_map_keeps_an_entry_for_at_most_one_second_by_default() -> None:
    from sandman_site.settings import base

    assert base.SANDMAN_API_TOKEN_TTL_S <= 1.0
    assert access.token_ttl_s() <= 1.0


def test_a_token_revoked_in_another_process_stops_working_within_one_second() -> None:
    access.clear()
    user, key = make_user("revoked-elsewhere")
    clock = FakeClock()
    found, _ = async_to_sync(access.token_user)(key, clock=clock)
    assert found.pk == user.pk
    _revoke_elsewhere(key)

    clock.now += 0.5  # inside the window: still served from memory, no query
    assert access.cached_token_user(key, clock=clock).pk == user.pk

    clock.now += 0.5  # 1 s after it was read: gone from memory, the database says no
    assert access.cached_token_user(key, clock=clock) is None
    with pytest.raises(AuthenticationFailed):
        async_to_sync(access.token_user)(key, clock=clock)
    access.clear()


def test_a_token_deleted_in_this_process_stops_working_at_once() -> None:
    from rest_framework.authtoken.models import Token

    access.clear()
    _, key = make_user("revoked-here")
    clock = FakeClock()
    async_to_sync(access.token_user)(key, clock=clock)
    Token.objects.filter(key=key).delete()  # sends post_delete here
    assert access.cached_token_user(key, clock=clock) is None
    with pytest.raises(AuthenticationFailed):
        async_to_sync(access.token_user)(key, clock=clock)
    access.clear()


class _GatedRead:
    """``TokenAuthentication.authenticate_credentials`` counted, its first call held until
    ``release`` is set (``entered`` says it is under way)."""

    def __init__(self) -> None:
        from rest_framework.authentication import TokenAuthentication

        self.real = TokenAuthentication.authenticate_credentials
        self.calls = 0
        self.entered = threading.Event()
        self.release = threading.Event()

    def __call__(self, auth: object, key: str) -> object:
        self.calls += 1
        self.entered.set()
        assert self.release.wait(timeout=30), "the test never released the read"
        return self.real(auth, key)  # type: ignore[arg-type]


@pytest.fixture
def gated_read(monkeypatch: pytest.MonkeyPatch) -> Iterator[_GatedRead]:
    from rest_framework.authentication import TokenAuthentication

    gate = _GatedRead()

    def gated(auth: object, key: str) -> object:  # a function: bound as the method is
        return gate(auth, key)

    monkeypatch.setattr(TokenAuthentication, "authenticate_credentials", gated)
    access.clear()
    yield gate
    access.clear()


def test_concurrent_misses_of_one_token_share_one_database_read(gated_read: _GatedRead) -> None:
    """Every ``token_ttl_s()`` a busy token's entry expires and a burst's requests all miss
    at once: they share ONE read of the token and its user, not one each in turn."""
    user, key = make_user("burst")

    async def burst() -> list[tuple[object, object]]:
        callers = [asyncio.create_task(access.token_user(key)) for _ in range(8)]
        # Once the first read is under way every caller has run up to its wait.
        assert await asyncio.to_thread(gated_read.entered.wait, 30)
        gated_read.release.set()
        return await asyncio.gather(*callers)

    found = async_to_sync(burst)()
    assert gated_read.calls == 1
    assert {u.pk for u, _ in found} == {user.pk}  # type: ignore[attr-defined]


def test_a_caller_that_leaves_does_not_take_the_shared_read_with_it(
    gated_read: _GatedRead,
) -> None:
    user, key = make_user("leaves")

    async def scenario() -> object:
        first = asyncio.create_task(access.token_user(key))
        second = asyncio.create_task(access.token_user(key))
        assert await asyncio.to_thread(gated_read.entered.wait, 30)
        first.cancel()  # the first caller's client went away
        gated_read.release.set()
        found, _ = await second
        with pytest.raises(asyncio.CancelledError):
            await first
        return found

    assert async_to_sync(scenario)().pk == user.pk  # type: ignore[attr-defined]
    assert gated_read.calls == 1
    cached = access.cached_token_user(key)
    assert cached is not None and cached.pk == user.pk


class _GatedOwnerRead:
    """``selectors.job_owner_id`` counted, its first call held until ``release`` is set."""

    def __init__(self) -> None:
        from sandboxes import selectors

        self.real = selectors.job_owner_id
        self.calls = 0
        self.entered = threading.Event()
        self.release = threading.Event()

    def __call__(self, *, job_id: int) -> int | None:
        self.calls += 1
        self.entered.set()
        assert self.release.wait(timeout=30), "the test never released the read"
        return self.real(job_id=job_id)


def test_concurrent_misses_of_one_job_share_one_read_and_each_caller_gets_its_own_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A job created through another web worker is unknown here (its signal was that
    process's), and the first burst of its acquires all miss at once: they share ONE read
    of its owner, and the selectors' rule then answers each caller (the owner and staff
    may use it; another user gets the same ``NotFound`` as for a job that does not exist).
    Before, each caller read the job in turn in the request thread."""
    from sandboxes import selectors
    from sandboxes.tests.controller_support import make_job
    from sandman_site.errors import NotFound

    job = make_job()
    owner = job.owner
    stranger, _ = make_user("stranger")
    staff, _ = make_user("staff", staff=True)
    gate = _GatedOwnerRead()
    monkeypatch.setattr(selectors, "job_owner_id", gate)
    access.clear()  # as in a worker that did not create the job

    async def burst() -> list[object]:
        callers = [
            asyncio.create_task(access.check_job(user=user, job_id=job.pk))
            for user in [owner] * 6 + [stranger, staff]
        ]
        assert await asyncio.to_thread(gate.entered.wait, 30)
        gate.release.set()
        return await asyncio.gather(*callers, return_exceptions=True)

    answers = async_to_sync(burst)()
    assert gate.calls == 1
    assert answers[:6] == [None] * 6 and answers[7] is None
    assert isinstance(answers[6], NotFound) and str(answers[6]) == f"No job {job.pk}."
    assert access.job_visible_cached(user=owner, job_id=job.pk) is True  # remembered

    # A job that does not exist: NotFound for every caller, still one read.
    gate.calls, gate.release = 0, threading.Event()
    gate.entered.clear()
    missing = job.pk + 1000

    async def nobody() -> list[object]:
        callers = [
            asyncio.create_task(access.check_job(user=owner, job_id=missing)) for _ in range(4)
        ]
        assert await asyncio.to_thread(gate.entered.wait, 30)
        gate.release.set()
        return await asyncio.gather(*callers, return_exceptions=True)

    gone = async_to_sync(nobody)()
    assert gate.calls == 1
    assert all(isinstance(a, NotFound) for a in gone), gone
    assert access.job_visible_cached(user=owner, job_id=missing) is None
