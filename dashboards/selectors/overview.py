"""Reads behind the overview page (``/``): one aggregate query per chart.

Rules a reader must not break:
* Aggregate in the database (``dashboards.sql``): counts, buckets and percentiles are
  computed by SQL; Python only converts the one row per bucket or group it gets back.
  No per-row Python loops, no N+1 (job names come with the same query).
* Time is a parameter: every function takes a :class:`~dashboards.filters.ChartFilter`
  (its window built by the caller from its own ``now``); nothing here reads the clock. The
  filter's jobs and backend narrow every query in SQL; per-job rows are cut to its top N
  plus "others".
* Definitions (shown on the page too):
  - a *create* is a sandbox row, counted at ``requested_at``;
  - *create-to-Ready* is ``ready_at - requested_at`` of sandboxes Ready inside the window
    (rows with ``ready_at < requested_at`` are clock errors and left out);
  - *acquisition wait* is ``Acquisition.wait_ms`` (pacer queue included) of acquisitions
    finished inside the window, any outcome (a timed-out caller waited too);
  - a *warm hit* is a successful acquisition served by a warm or reused sandbox.
* Windows over 15 h are read from the rollups (``selectors.rolled``): the same counts,
  percentiles within 5 % (or 1 ms) of the exact ones.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from django.db.models import Case, CharField, Count, F, Max, Q, QuerySet, Value, When

from dashboards.filters import OTHERS, ChartFilter, top_with_others
from dashboards.rows.overview import (
    CreateRate,
    HistogramBin,
    ImageSplit,
    LatencyBucket,
    StateCount,
    WaitBucket,
    WarmHits,
)
from dashboards.selectors import rolled
from dashboards.sql import (
    DurationMs,
    FloorDiv,
    epoch_bucket,
    grouped_percentiles,
    raw_rows,
)
from dashboards.stats import nice_step
from dashboards.window import bucket_start
from sandboxes.models import Acquisition, Sandbox
from sandboxes.states import SANDBOX_LIVE, AcquisitionOutcome, SandboxSource, SandboxState

LATENCY_FRACTIONS = (0.5, 0.9, 0.99)
WAIT_FRACTIONS = (0.5, 0.99)
HISTOGRAM_MAX_BINS = 40
# Live states in the order the bar chart shows them (the lifecycle's order).
LIVE_STATE_ORDER = tuple(s for s in SandboxState if s in SANDBOX_LIVE)


def live_sandboxes_by_state(flt: ChartFilter | None = None) -> list[StateCount]:
    """Sandboxes holding (or about to hold) a backend resource, per state; zeros included.

    Now, not windowed: the filter's jobs and backend apply, its time range does not."""
    live = Sandbox.objects.filter(state__in=LIVE_STATE_ORDER)
    if flt is not None:
        live = flt.sandboxes(live)
    counts = dict(live.order_by().values_list("state").annotate(n=Count("pk")))
    return [StateCount(state=str(state), count=counts.get(state, 0)) for state in LIVE_STATE_ORDER]


def creates_per_bucket(flt: ChartFilter) -> list[CreateRate]:
    """Creates per bucket: total, mean per second, and the busiest second (burst peak)."""
    plan = rolled.plan_of(flt)
    if plan is not None:
        from_rollups = rolled.creates_per_bucket(flt, plan)
        if from_rollups is not None:
            return from_rollups
    window = flt.window
    per_second = (
        flt.sandboxes(Sandbox.objects.all())
        .filter(requested_at__gte=window.since, requested_at__lt=window.until)
        .order_by()
        .annotate(dash_sec=epoch_bucket("requested_at", 1))
        .values("dash_sec")
        .annotate(dash_n=Count("pk"))
        .values_list("dash_sec", "dash_n")
    )
    inner_sql, params = per_second.query.sql_with_params()
    bucket_s = int(window.bucket_s)  # a validated int, written as a literal: integer division
    rows = raw_rows(
        f"SELECT dash_sec / {bucket_s} AS dash_bucket, SUM(dash_n), MAX(dash_n) "
        f"FROM ({inner_sql}) dash_per_second GROUP BY dash_sec / {bucket_s} ORDER BY dash_bucket",
        params,
    )
    return [
        CreateRate(
            bucket_start=bucket_start(bucket, bucket_s),
            bucket_s=bucket_s,
            creates=int(total),
            peak_per_s=int(peak),
        )
        for bucket, total, peak in rows
    ]


def _ready_in(flt: ChartFilter) -> QuerySet[Sandbox]:
    window = flt.window
    ready = Sandbox.objects.filter(ready_at__gte=window.since, ready_at__lt=window.until)
    return flt.sandboxes(ready).filter(ready_at__gte=F("requested_at"))


def _create_to_ready() -> DurationMs:
    return DurationMs(F("ready_at"), F("requested_at"))


def ready_time_over_time(flt: ChartFilter) -> list[LatencyBucket]:
    """Create-to-Ready p50/p90/p99 per bucket of ``ready_at``."""
    plan = rolled.plan_of(flt)
    if plan is not None:
        return rolled.ready_time_over_time(flt, plan)
    window = flt.window
    groups = grouped_percentiles(
        _ready_in(flt),
        group=epoch_bucket("ready_at", window.bucket_s),
        value=_create_to_ready(),
        fractions=LATENCY_FRACTIONS,
    )
    return [
        LatencyBucket(
            bucket_start=bucket_start(g.group, window.bucket_s),
            n=g.n,
            p50_ms=g.values[0],
            p90_ms=g.values[1],
            p99_ms=g.values[2],
        )
        for g in groups
    ]


def _image_class() -> Case:
    return Case(
        When(image_present=True, then=Value("present")),
        When(image_present=False, then=Value("pulled")),
        default=Value("unknown"),
        output_field=CharField(),
    )


def ready_time_by_image(flt: ChartFilter) -> list[ImageSplit]:
    """Create-to-Ready percentiles split by image already on the node vs pulled."""
    plan = rolled.plan_of(flt)
    if plan is not None:
        return rolled.ready_time_by_image(flt, plan)
    groups = grouped_percentiles(
        _ready_in(flt),
        group=_image_class(),
        value=_create_to_ready(),
        fractions=LATENCY_FRACTIONS,
    )
    by_class = {g.group: g for g in groups}
    order = ("present", "pulled", "unknown")
    return [
        ImageSplit(
            image=name,
            n=by_class[name].n,
            p50_ms=by_class[name].values[0],
            p90_ms=by_class[name].values[1],
            p99_ms=by_class[name].values[2],
        )
        for name in order
        if name in by_class
    ]


def ready_time_histogram(
    flt: ChartFilter, *, max_bins: int = HISTOGRAM_MAX_BINS
) -> list[HistogramBin]:
    """Create-to-Ready counts in equal 1-2-5 bins (at most ``max_bins``), by image class.

    Two queries: the longest duration (to size the bins), then the counts per bin.
    """
    plan = rolled.plan_of(flt)
    if plan is not None:
        return rolled.ready_time_histogram(flt, plan, max_bins=max_bins)
    qs = _ready_in(flt)
    longest = qs.aggregate(longest=Max(_create_to_ready()))["longest"]
    if longest is None:
        return []
    width = nice_step(max(float(longest), 1.0) / max_bins)
    counts = (
        qs.order_by()
        .annotate(dash_bin=FloorDiv(_create_to_ready(), width), dash_image=_image_class())
        .values_list("dash_bin", "dash_image")
        .annotate(dash_n=Count("pk"))
        .order_by("dash_bin")
    )
    bins: dict[int, dict[str, int]] = defaultdict(dict)
    for index, image, n in counts:  # one row per (bin, image class), never per sandbox
        bins[int(index)][image] = n
    return [
        HistogramBin(
            start_ms=index * width,
            width_ms=width,
            present=bins[index].get("present", 0),
            pulled=bins[index].get("pulled", 0),
            unknown=bins[index].get("unknown", 0),
        )
        for index in sorted(bins)
    ]


def acquisition_wait_over_time(flt: ChartFilter) -> list[WaitBucket]:
    """Acquisition wait (queue included) and pacer-queue p50/p99 per bucket of ``finished_at``.

    Two queries: a NULL ``queue_ms`` must not drop the row from the wait percentiles.
    """
    plan = rolled.plan_of(flt)
    if plan is not None:
        return rolled.acquisition_wait_over_time(flt, plan)
    window = flt.window
    finished = flt.acquisitions(
        Acquisition.objects.filter(finished_at__gte=window.since, finished_at__lt=window.until)
    )
    group = epoch_bucket("finished_at", window.bucket_s)
    waits = grouped_percentiles(finished, group=group, value=F("wait_ms"), fractions=WAIT_FRACTIONS)
    queues = {
        g.group: g
        for g in grouped_percentiles(
            finished, group=group, value=F("queue_ms"), fractions=WAIT_FRACTIONS
        )
    }
    rows = []
    for g in waits:
        queue = queues.get(g.group)
        rows.append(
            WaitBucket(
                bucket_start=bucket_start(g.group, window.bucket_s),
                n=g.n,
                wait_p50_ms=g.values[0],
                wait_p99_ms=g.values[1],
                queue_p50_ms=queue.values[0] if queue else None,
                queue_p99_ms=queue.values[1] if queue else None,
            )
        )
    return rows


def _merge_warm_hits(rows: Sequence[WarmHits]) -> WarmHits:
    return WarmHits(
        job_id=None,
        job_name=f"{OTHERS} ({len(rows)} jobs)",
        warm=sum(r.warm for r in rows),
        reused=sum(r.reused for r in rows),
        created=sum(r.created for r in rows),
    )


def warm_hits_by_job(flt: ChartFilter) -> list[WarmHits]:
    """Successful acquisitions finished in the window, per job, by source; one query.

    The filter's top N jobs by acquisitions, the rest summed into one "others" row."""
    plan = rolled.plan_of(flt)
    if plan is not None:
        hits = [
            WarmHits(
                job_id=job_id,
                job_name=name,
                warm=counts.get(SandboxSource.WARM, 0),
                reused=counts.get(SandboxSource.REUSED, 0),
                created=sum(
                    n
                    for src, n in counts.items()
                    if src not in (SandboxSource.WARM, SandboxSource.REUSED)
                ),
            )
            for job_id, name, counts in rolled.warm_hits_counts(flt, plan)
        ]
        return top_with_others(
            hits,
            top=flt.top,
            volume=lambda r: r.warm + r.reused + r.created,
            merge=_merge_warm_hits,
        )
    window = flt.window
    rows = (
        flt.acquisitions(
            Acquisition.objects.filter(
                outcome=AcquisitionOutcome.OK,
                finished_at__gte=window.since,
                finished_at__lt=window.until,
            )
        )
        .order_by()
        .values("job_id", "job__name")
        .annotate(
            warm=Count("pk", filter=Q(source=SandboxSource.WARM)),
            reused=Count("pk", filter=Q(source=SandboxSource.REUSED)),
            created=Count("pk", filter=~Q(source__in=[SandboxSource.WARM, SandboxSource.REUSED])),
        )
        .order_by("job_id")
    )
    per_job = [
        WarmHits(
            job_id=row["job_id"],
            job_name=row["job__name"],
            warm=row["warm"],
            reused=row["reused"],
            created=row["created"],
        )
        for row in rows
    ]
    return top_with_others(
        per_job,
        top=flt.top,
        volume=lambda r: r.warm + r.reused + r.created,
        merge=_merge_warm_hits,
    )
