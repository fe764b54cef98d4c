"""The database lost right after a write's COMMIT: the answer still tells the truth.

``dbguard`` promises that a 503 means nothing was stored. A view that reads again after its
service committed (to build the answer) breaks that promise when PostgreSQL goes away
between the two: the row is there and the client is told it is not, so a trainer that
retries registers the job twice (seen in ``test_chaos_postgres``). Here the loss is
placed exactly: every query after the COMMIT that wrote the row fails the way a dropped
connection does (``OperationalError``), and the create must still answer its 201.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.db import OperationalError, connection, transaction

from sandboxes.models import Job
from sandboxes.tests.api_support import api, job_payload, make_user

pytestmark = pytest.mark.django_db(transaction=True)


@contextmanager
def database_lost_after_commit_of(insert_into: str) -> Iterator[dict[str, int]]:
    """Once a transaction that inserted into ``insert_into`` commits, every query fails."""
    state = {"committed": 0, "refused": 0}

    def wrapper(execute: Callable[..., Any], sql: str, params: Any, many: bool, ctx: Any) -> Any:
        if state["committed"]:
            state["refused"] += 1
            raise OperationalError("server closed the connection unexpectedly")
        result = execute(sql, params, many, ctx)
        if sql.lstrip().upper().startswith(f'INSERT INTO "{insert_into}"'.upper()):
            transaction.on_commit(lambda: state.__setitem__("committed", 1))
        return result

    with connection.execute_wrapper(wrapper):
        yield state


def test_a_job_create_answers_201_from_what_it_wrote_when_the_database_goes_after_commit():
    _, token = make_user("alice")
    client = api(token)
    with database_lost_after_commit_of("sandboxes_job") as state:
        response = client.post("/api/v1/jobs/", job_payload(name="after-commit"), format="json")
    assert state["committed"] == 1  # the loss really happened after the COMMIT
    assert response.status_code == 201, response.content
    data = response.json()
    assert data["name"] == "after-commit"
    assert data["counts"] == {"live": 0, "warm": 0, "creating": 0}
    assert Job.objects.filter(pk=data["id"], name="after-commit").exists()


def test_the_harness_does_refuse_queries_after_the_commit():
    """The fault is real: a read after the COMMIT meets it (and answers 503, not 500)."""
    _, token = make_user("bob")
    client = api(token)
    with database_lost_after_commit_of("sandboxes_job") as state:
        created = client.post("/api/v1/jobs/", job_payload(name="b"), format="json")
        listed = client.get("/api/v1/jobs/")
    assert created.status_code == 201
    assert state["refused"] >= 1
    assert listed.status_code == 503
    assert listed.json()["error"] == "database_unavailable"
