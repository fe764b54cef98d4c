"""``rawinsert.preparers``: each field's fast preparation gives exactly what Django's
``get_db_prep_save`` gives, for every concrete field of every model of the project and a
bank of values of every kind (the exact types it shortcuts, their subclasses, naive
datetimes, expressions, junk). Run on the test database's backend: PostgreSQL in CI, where
the shortcuts apply."""

from __future__ import annotations

import datetime as dt
import decimal
import enum
import warnings
from typing import Any

import pytest
from django.apps import apps
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.models import F, Field, Value
from psycopg.types.json import Jsonb

from sandboxes.services.rawinsert import preparers
from sandboxes.states import SandboxState

PROJECT_APPS = ("sandboxes", "grading", "incidents", "dashboards", "rollups")


class Small(enum.IntEnum):
    ONE = 1


class MyStr(str):
    pass


VALUES: list[Any] = [
    None, 0, 7, -3, 2**40, True, False, 1.5, -0.0, "", "text", "7", "2026-12-07T05:00:00Z",
    MyStr("sub"), SandboxState.READY, Small.ONE,
    dt.datetime(2026, 12, 7, 5, 0, tzinfo=dt.UTC),
    dt.datetime(2026, 12, 7, 5, 0, tzinfo=dt.timezone(dt.timedelta(hours=2))),
    dt.datetime(2026, 12, 7, 5, 0),  # naive: Django makes it aware, with a warning
    dt.date(2026, 12, 7), decimal.Decimal("2.5"), {"a": [1, None]}, [1, "x"], b"raw",
    Value(3), F("id"), object(),
]  # fmt: skip


def _fields() -> list[Field[Any, Any]]:
    out = []
    for label in PROJECT_APPS:
        for model in apps.get_app_config(label).get_models():
            out.extend(f for f in model._meta.concrete_fields if isinstance(f, Field))
    return out


def _outcome(prepare: Any, value: Any) -> tuple[str, Any]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a naive datetime's RuntimeWarning, both ways
        try:
            got = prepare(value)
        except Exception as exc:  # the same refusal both ways
            return "raises", type(exc)
    if isinstance(got, Jsonb):  # no __eq__: compare what it wraps and how it dumps
        return "value", (Jsonb, got.obj, got.dumps)
    if isinstance(got, Value | F):
        return "value", got  # passed through as is
    return "value", (type(got), got)


def test_every_field_prepares_every_value_as_django_does() -> None:
    connection = connections[DEFAULT_DB_ALIAS]
    fields = _fields()
    assert len(fields) > 100  # the whole project, not an empty list
    fast = preparers(connection, fields)
    compared = 0
    for field, prepare in zip(fields, fast, strict=True):
        for value in VALUES:
            django = _outcome(lambda v, f=field: f.get_db_prep_save(v, connection), value)
            assert _outcome(prepare, value) == django, (field, value)
            compared += 1
    assert compared == len(fields) * len(VALUES)


@pytest.mark.skipif(
    connections[DEFAULT_DB_ALIAS].vendor != "postgresql", reason="the shortcuts are PostgreSQL's"
)
def test_on_postgresql_the_exact_types_skip_djangos_chain(monkeypatch: pytest.MonkeyPatch) -> None:
    """The point of the preparers: the values the controller writes never enter Django's
    chain (a field whose ``get_db_prep_save`` raises is never asked), and the typed
    integers psycopg binds come out as Django's adapter makes them."""
    from psycopg.types.numeric import Int4

    from sandboxes.models import Sandbox

    connection = connections[DEFAULT_DB_ALIAS]
    names = ("state", "cpu_millis", "ready_at", "job", "address")
    fields = [Sandbox._meta.get_field(name) for name in names]
    prepare = preparers(connection, fields)  # type: ignore[arg-type]
    for field in fields:
        monkeypatch.setattr(field, "get_db_prep_save", _never)
    at = dt.datetime(2026, 12, 7, 5, 0, tzinfo=dt.UTC)
    got = [p(v) for p, v in zip(prepare, ("ready", 250, at, 12, "10.0.0.7"), strict=True)]
    assert got == ["ready", 250, at, 12, "10.0.0.7"]
    assert type(got[1]) is Int4
    with pytest.raises(AssertionError, match="Django's chain"):
        prepare[1](True)  # a bool on an integer field: Django's own conversion


def _never(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("Django's chain was asked")


def test_a_value_django_prepares_uses_the_calling_threads_connection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Preparers are built once and shared by every thread (the database executor's, a
    request's); a value that takes Django's chain gets the connection of the thread that
    prepares it, never that of the thread the preparer was first built on (Django's
    connections are per thread)."""
    import threading

    from sandboxes.models import Sandbox

    field = Sandbox._meta.get_field("cpu_millis")
    built_on = connections[DEFAULT_DB_ALIAS]
    prepare = preparers(built_on, [field])[0]  # type: ignore[list-item]
    seen: list[Any] = []

    def recording(value: Any, connection: Any) -> Any:
        seen.append(connection)
        return value

    monkeypatch.setattr(field, "get_db_prep_save", recording)
    here: list[Any] = []

    def elsewhere() -> None:
        here.append(connections[DEFAULT_DB_ALIAS])
        prepare(True)  # a bool on an integer field: Django's chain
        connections.close_all()

    thread = threading.Thread(target=elsewhere)
    thread.start()
    thread.join()
    assert here[0] is not built_on  # a thread of its own has a connection of its own
    assert seen == [here[0]]
