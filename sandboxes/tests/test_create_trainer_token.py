"""``manage.py create_trainer_token``: prints a working DRF token, creating the user once."""

from __future__ import annotations

import io

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from rest_framework.authtoken.models import Token

pytestmark = pytest.mark.django_db


def run(*args: str) -> str:
    out = io.StringIO()
    call_command("create_trainer_token", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue().strip()


def test_it_creates_the_user_and_prints_only_a_token_that_authenticates(client):
    key = run("trainer-a")
    user = get_user_model().objects.get(username="trainer-a")
    assert Token.objects.get(user=user).key == key
    assert not user.has_usable_password()
    anonymous = client.get("/api/v1/jobs/")
    assert anonymous.status_code in (401, 403)
    answer = client.get("/api/v1/jobs/", HTTP_AUTHORIZATION=f"Token {key}")
    assert answer.status_code not in (401, 403), answer.content


def test_running_it_again_prints_the_same_token_and_rotate_replaces_it():
    first = run("trainer-b")
    assert run("trainer-b") == first
    rotated = run("trainer-b", "--rotate")
    assert rotated != first
    assert list(Token.objects.values_list("key", flat=True)) == [rotated]


def test_an_invalid_username_is_refused_without_creating_anyone():
    with pytest.raises(CommandError):
        run("not a valid name!")
    assert get_user_model().objects.count() == 0
