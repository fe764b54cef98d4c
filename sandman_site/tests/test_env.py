"""The environment reader: DATABASE_URL translation and typed variables."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandman_site.env import ConfigError, database_from_url, env_bool, env_float, env_int


def test_empty_database_url_means_a_sqlite_file_under_var(tmp_path: Path) -> None:
    db = database_from_url("", sqlite_default=tmp_path / "x.sqlite3")
    assert db["ENGINE"] == "django.db.backends.sqlite3"
    assert db["NAME"] == str(tmp_path / "x.sqlite3")


def test_postgres_url_is_split_into_django_fields(tmp_path: Path) -> None:
    db = database_from_url(
        "postgres://sand%40man:p%2Fw@db.example:6543/sandman", sqlite_default=tmp_path / "x"
    )
    assert db["ENGINE"] == "django.db.backends.postgresql"
    assert (db["USER"], db["PASSWORD"], db["HOST"], db["PORT"], db["NAME"]) == (
        "sand@man",
        "p/w",
        "db.example",
        "6543",
        "sandman",
    )


def test_postgres_socket_directory_comes_from_the_host_parameter(tmp_path: Path) -> None:
    db = database_from_url(
        "postgresql://postgres@/sandman?host=/tmp/pgsock", sqlite_default=tmp_path
    )
    assert db["HOST"] == "/tmp/pgsock"
    assert "host" not in db["OPTIONS"]


def test_unsupported_database_scheme_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="mysql"):
        database_from_url("mysql://x@y/z", sqlite_default=tmp_path)


def test_typed_variables_refuse_garbage(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SANDMAN_X_INT", "12")
    monkeypatch.setenv("SANDMAN_X_FLOAT", "2.5")
    monkeypatch.setenv("SANDMAN_X_BOOL", "off")
    assert env_int("SANDMAN_X_INT", 0) == 12
    assert env_float("SANDMAN_X_FLOAT", 0.0) == 2.5
    assert env_bool("SANDMAN_X_BOOL", True) is False
    monkeypatch.setenv("SANDMAN_X_INT", "twelve")
    with pytest.raises(ConfigError, match="SANDMAN_X_INT"):
        env_int("SANDMAN_X_INT", 0)
    monkeypatch.setenv("SANDMAN_X_BOOL", "maybe")
    with pytest.raises(ConfigError, match="SANDMAN_X_BOOL"):
        env_bool("SANDMAN_X_BOOL", True)


def test_postgres_gets_a_connection_pool_and_no_persistent_connections(tmp_path: Path) -> None:
    db = database_from_url("postgresql://u@/sandman?host=/s", sqlite_default=tmp_path, pool_max=32)
    assert db["OPTIONS"]["pool"] == {"min_size": 4, "max_size": 32, "timeout": 10.0}
    assert db["CONN_MAX_AGE"] == 0  # each request hands its connection back to the pool
    small = database_from_url("postgresql://u@/s", sqlite_default=tmp_path, pool_max=2)
    assert small["OPTIONS"]["pool"]["min_size"] == 2


def test_a_zero_pool_size_turns_the_pool_off_and_a_negative_one_is_refused(tmp_path: Path) -> None:
    db = database_from_url("postgresql://u@/sandman", sqlite_default=tmp_path, pool_max=0)
    assert "pool" not in db["OPTIONS"] and db["CONN_MAX_AGE"] == 60
    with pytest.raises(ConfigError, match="SANDMAN_DB_POOL_MAX"):
        database_from_url("postgresql://u@/sandman", sqlite_default=tmp_path, pool_max=-1)


def test_sqlite_runs_in_wal_mode_and_waits_for_a_locked_database(tmp_path: Path) -> None:
    import sqlite3

    db = database_from_url("", sqlite_default=tmp_path / "x.sqlite3")
    assert db["OPTIONS"]["timeout"] == 30
    connection = sqlite3.connect(db["NAME"])
    try:
        for statement in db["OPTIONS"]["init_command"].split(";"):
            if statement.strip():
                connection.execute(statement)
        assert connection.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        assert connection.execute("PRAGMA synchronous").fetchone() == (1,)  # NORMAL
    finally:
        connection.close()
