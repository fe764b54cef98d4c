"""``sandboxes.apis.access``'s token map: a token revoked anywhere stops working within
1 s in every process (issue 13 item 6), with the clock injected (no wall-time sleeps).

"Anywhere" is modelled by a revocation this process gets no signal for: the row is
deleted with raw SQL, as another process's delete looks from here. ``async_to_sync``
runs the map's database reads in this test's thread (its connection is the test's).
"""

from __future__ import annotations

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
