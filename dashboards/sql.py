"""Database expressions for the operator pages: epoch buckets, durations, percentiles.

Everything here aggregates IN the database (CONVENTIONS "Dashboards aggregate in the
database"); Python only sees one row per group. Two engines are supported:

* PostgreSQL: ``PERCENTILE_CONT(f) WITHIN GROUP (ORDER BY v)`` per group, one query.
* SQLite (no ordered-set aggregates): one query with window functions (``ROW_NUMBER`` and
  ``COUNT`` over each group) that returns, per group, the two values around rank
  ``(n-1)·f``; Python interpolates between them exactly as ``percentile_cont`` does.
  The window-function query is portable SQL, so it also runs on PostgreSQL (``method=
  "window"``), which the tests use to check that both methods agree.

Durations are milliseconds (``DOUBLE PRECISION`` on PostgreSQL, whole ms on SQLite, whose
``julianday`` keeps milliseconds). Other engines raise ``NotSupportedError``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.db import NotSupportedError, connection
from django.db.models import (
    Aggregate,
    BigIntegerField,
    Count,
    Expression,
    F,
    FloatField,
    Func,
    QuerySet,
)

from dashboards.stats import percentile_from_ranks

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper
    from django.db.models.sql.compiler import SQLCompiler

_UNIX_EPOCH_JULIAN_DAY = 2440587.5
_MS_PER_DAY = 86400000.0


class _VendorFunc(Func):
    """A Func with a template per engine; other engines are refused, not guessed."""

    templates: dict[str, str] = {}

    def as_sql(
        self,
        compiler: SQLCompiler,
        connection: BaseDatabaseWrapper,
        function: str | None = None,
        template: str | None = None,
        arg_joiner: str | None = None,
        **extra_context: Any,
    ) -> tuple[str, Any]:
        vendor_template = self.templates.get(connection.vendor)
        if vendor_template is None:
            raise NotSupportedError(
                f"{type(self).__name__} is not available on {connection.vendor}"
            )
        return super().as_sql(
            compiler,
            connection,
            function=function,
            template=vendor_template,
            arg_joiner=arg_joiner,
            **extra_context,
        )


class EpochMs(_VendorFunc):
    """Milliseconds since the Unix epoch of a datetime column."""

    output_field = FloatField()
    templates = {
        "postgresql": "CAST(EXTRACT(EPOCH FROM %(expressions)s) * 1000 AS DOUBLE PRECISION)",
        "sqlite": f"ROUND((julianday(%(expressions)s) - {_UNIX_EPOCH_JULIAN_DAY}) * {_MS_PER_DAY})",
    }


class DurationMs(_VendorFunc):
    """``end - start`` in milliseconds (two datetime expressions)."""

    output_field = FloatField()
    arity = 2

    def as_sql(
        self,
        compiler: SQLCompiler,
        connection: BaseDatabaseWrapper,
        function: str | None = None,
        template: str | None = None,
        arg_joiner: str | None = None,
        **extra_context: Any,
    ) -> tuple[str, Any]:
        end_sql, end_params = compiler.compile(self.source_expressions[0])
        start_sql, start_params = compiler.compile(self.source_expressions[1])
        if connection.vendor == "postgresql":
            sql = f"CAST(EXTRACT(EPOCH FROM ({end_sql} - {start_sql})) * 1000 AS DOUBLE PRECISION)"
        elif connection.vendor == "sqlite":
            sql = f"ROUND((julianday({end_sql}) - julianday({start_sql})) * {_MS_PER_DAY})"
        else:
            raise NotSupportedError(f"DurationMs is not available on {connection.vendor}")
        return sql, (*end_params, *start_params)


class FloorDiv(Func):
    """``floor(value / step)`` as an integer: the index of the step-wide bin of ``value``."""

    output_field = BigIntegerField()

    def __init__(self, expression: Any, step: float) -> None:
        if not step > 0:
            raise ValueError("step must be positive")
        # The step is a validated number, written as a literal so GROUP BY sees one expression.
        super().__init__(
            expression, template=f"CAST(FLOOR(%(expressions)s / {float(step)!r}) AS BIGINT)"
        )


def epoch_bucket(field: str, bucket_s: int) -> FloorDiv:
    """Index of the ``bucket_s``-second bucket (counted from the epoch) a datetime falls in."""
    return FloorDiv(EpochMs(F(field)), bucket_s * 1000)


class PercentileCont(Aggregate):
    """PostgreSQL's ordered-set aggregate ``PERCENTILE_CONT(fraction)``."""

    function = "PERCENTILE_CONT"
    name = "PercentileCont"
    output_field = FloatField()
    template = "%(function)s(%(fraction)s) WITHIN GROUP (ORDER BY %(expressions)s)"

    def __init__(self, expression: Any, fraction: float) -> None:
        if not 0.0 <= fraction <= 1.0:
            raise ValueError("fraction must be within [0, 1]")
        super().__init__(expression, fraction=repr(float(fraction)))

    def as_sqlite(self, compiler: Any, connection: Any, **extra: Any) -> Any:
        raise NotSupportedError("PERCENTILE_CONT needs PostgreSQL; use grouped_percentiles")


@dataclass(frozen=True)
class GroupPercentiles:
    group: Any
    n: int
    values: tuple[float | None, ...]  # one per requested fraction, in order


def grouped_percentiles(
    qs: QuerySet,
    *,
    group: Expression | F,
    value: Expression | F,
    fractions: Sequence[float],
    method: str = "auto",
) -> list[GroupPercentiles]:
    """Per value of ``group``: the row count with a non-null ``value`` and its percentiles.

    One query. ``method``: ``"auto"`` (PERCENTILE_CONT on PostgreSQL, window functions
    elsewhere), ``"native"`` or ``"window"``. Groups come back in ascending order.
    """
    for fraction in fractions:
        if not 0.0 <= fraction <= 1.0:
            raise ValueError("fractions must be within [0, 1]")
    base = (
        qs.order_by().annotate(dash_group=group, dash_value=value).filter(dash_value__isnull=False)
    )
    native = connection.vendor == "postgresql" if method == "auto" else method == "native"
    if native:
        aggregates = {
            f"dash_p{i}": PercentileCont(F("dash_value"), f) for i, f in enumerate(fractions)
        }
        rows = (
            base.values("dash_group")
            .annotate(dash_n=Count("*"), **aggregates)
            .order_by("dash_group")
        )
        return [
            GroupPercentiles(
                group=row["dash_group"],
                n=row["dash_n"],
                values=tuple(row[f"dash_p{i}"] for i in range(len(fractions))),
            )
            for row in rows
        ]
    return _window_percentiles(base, fractions)


def _window_percentiles(base: QuerySet, fractions: Sequence[float]) -> list[GroupPercentiles]:
    inner_sql, inner_params = base.values_list("dash_group", "dash_value").query.sql_with_params()
    picks = []
    for i, f in enumerate(fractions):
        rank = f"CAST(FLOOR((dash_n - 1) * {float(f)!r}) AS INTEGER)"  # PG rounds a CAST
        picks.append(f"MAX(CASE WHEN dash_rn = {rank} THEN dash_value END) AS dash_lo{i}")
        picks.append(f"MAX(CASE WHEN dash_rn = {rank} + 1 THEN dash_value END) AS dash_hi{i}")
    sql = (
        f"SELECT dash_group, dash_n, {', '.join(picks)} FROM ("
        "SELECT dash_group, dash_value, "
        "ROW_NUMBER() OVER (PARTITION BY dash_group ORDER BY dash_value) - 1 AS dash_rn, "
        "COUNT(*) OVER (PARTITION BY dash_group) AS dash_n "
        f"FROM ({inner_sql}) dash_src) dash_ranked "
        "GROUP BY dash_group, dash_n ORDER BY dash_group"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, inner_params)
        fetched = cursor.fetchall()
    result = []
    for row in fetched:
        group, n = row[0], int(row[1])
        values = tuple(
            percentile_from_ranks(row[2 + 2 * i], row[3 + 2 * i], n, f)
            for i, f in enumerate(fractions)
        )
        result.append(GroupPercentiles(group=group, n=n, values=values))
    return result


def raw_rows(sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()
