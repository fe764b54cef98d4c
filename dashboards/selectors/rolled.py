"""The overview and operations charts read from the rollups (``rollups``) for long windows.

:func:`plan_of` says whether a filter's window is served from the rollups (PostgreSQL, a
chart bucket of 30 minutes or more: windows over 15 hours); when it is, the selectors in
``selectors.overview`` and ``selectors.operations`` call the function here of the same name,
which returns the same row shapes. Counts are exact (the same numbers as the raw query);
percentiles come from log-spaced histogram bins and are within 5 % (or 1 ms) of the exact
``percentile_cont`` (``rollups.bins.ALPHA``, stated on the charts); the create-to-Ready histogram
places each sandbox by its bin's representative value, so a count may sit one bar over.
"""

from __future__ import annotations

import math
from collections import defaultdict

from dashboards.filters import ChartFilter
from dashboards.rows.operations import AddressFailureBucket, AddressFailureLoad
from dashboards.rows.overview import (
    CreateRate,
    HistogramBin,
    ImageSplit,
    LatencyBucket,
    WaitBucket,
)
from dashboards.stats import nice_step
from dashboards.window import bucket_start
from rollups import bins, reads
from rollups.families import Scope
from rollups.plan import Plan, window_plan
from sandboxes.states import SandboxSource

LATENCY_FRACTIONS = (0.5, 0.9, 0.99)
WAIT_FRACTIONS = (0.5, 0.99)
ROLLUP_CAPTION = (
    f"Windows over 15 h are read from 30-minute rollups: counts exact, percentiles from "
    f"histogram bins, within {bins.ALPHA:.0%} (or {bins.MIN_MS:g} ms) of the exact value."
)


def plan_of(flt: ChartFilter) -> Plan | None:
    """The rollup plan of the filter's window (once per request), or None: read raw rows."""
    window = flt.window
    return flt.remember(
        "rollups.plan", lambda: window_plan(window.since, window.until, window.bucket_s)
    )


def _scope(flt: ChartFilter) -> Scope:
    return Scope(job_ids=flt.job_ids, backend=flt.backend)


def ready_time_over_time(flt: ChartFilter, plan: Plan) -> list[LatencyBucket]:
    bucket_s = flt.window.bucket_s
    rows = []
    for b, counts in sorted(reads.ready_bins(plan, bucket_s, _scope(flt)).items()):
        n, values = bins.percentiles(counts, LATENCY_FRACTIONS)
        rows.append(
            LatencyBucket(
                bucket_start=bucket_start(b, bucket_s),
                n=n,
                p50_ms=values[0],
                p90_ms=values[1],
                p99_ms=values[2],
            )
        )
    return rows


def _ready_by_image(flt: ChartFilter, plan: Plan) -> dict[str, list[tuple[int, int]]]:
    """Create-to-Ready bins by image class, once per request (the split and the histogram)."""
    return flt.remember(
        "rollups.ready_by_image", lambda: reads.ready_bins_by_image(plan, _scope(flt))
    )


def ready_time_by_image(flt: ChartFilter, plan: Plan) -> list[ImageSplit]:
    by_image = _ready_by_image(flt, plan)
    out = []
    for name in ("present", "pulled", "unknown"):
        if name not in by_image:
            continue
        n, values = bins.percentiles(by_image[name], LATENCY_FRACTIONS)
        out.append(
            ImageSplit(image=name, n=n, p50_ms=values[0], p90_ms=values[1], p99_ms=values[2])
        )
    return out


def ready_time_histogram(flt: ChartFilter, plan: Plan, *, max_bins: int) -> list[HistogramBin]:
    by_image = _ready_by_image(flt, plan)
    reps = [(image, bins.representative(b), n) for image, c in by_image.items() for b, n in c]
    if not reps:
        return []
    longest = max(value for _, value, _ in reps)
    width = nice_step(max(float(longest), 1.0) / max_bins)
    counts: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for image, value, n in reps:
        counts[math.floor(value / width)][image] += n
    return [
        HistogramBin(
            start_ms=index * width,
            width_ms=width,
            present=counts[index].get("present", 0),
            pulled=counts[index].get("pulled", 0),
            unknown=counts[index].get("unknown", 0),
        )
        for index in sorted(counts)
    ]


def creates_per_bucket(flt: ChartFilter, plan: Plan) -> list[CreateRate] | None:
    bucket_s = flt.window.bucket_s
    rows = reads.creates(plan, bucket_s, _scope(flt))
    if rows is None:
        return None
    return [
        CreateRate(
            bucket_start=bucket_start(b, bucket_s), bucket_s=bucket_s, creates=n, peak_per_s=peak
        )
        for b, n, peak in rows
    ]


def acquisition_wait_over_time(flt: ChartFilter, plan: Plan) -> list[WaitBucket]:
    bucket_s = flt.window.bucket_s
    found = reads.wait_bins(plan, bucket_s, _scope(flt))
    rows = []
    for b in sorted({b for b, metric in found if metric == "wait"}):
        n, waits = bins.percentiles(found[(b, "wait")], WAIT_FRACTIONS)
        queue = found.get((b, "queue"))
        queues = bins.percentiles(queue, WAIT_FRACTIONS)[1] if queue else (None, None)
        rows.append(
            WaitBucket(
                bucket_start=bucket_start(b, bucket_s),
                n=n,
                wait_p50_ms=waits[0],
                wait_p99_ms=waits[1],
                queue_p50_ms=queues[0],
                queue_p99_ms=queues[1],
            )
        )
    return rows


def warm_hits_counts(flt: ChartFilter, plan: Plan) -> list[tuple[int, str, dict[str, int]]]:
    """``[(job, name, {source: n})]`` of successful acquisitions finished in the window."""
    return [
        (job_id, name, counts)
        for job_id, name, _, counts in reads.acquisitions_by_job(plan, _scope(flt), by_key=False)
    ]


def hits_by_key(flt: ChartFilter, plan: Plan) -> dict[tuple[int, str], tuple[str, int, int]]:
    """``{(job, key): (name, hits, acquisitions)}``: warm or reused over successful ones."""
    hit = (SandboxSource.WARM, SandboxSource.REUSED)
    return {
        (job_id, key): (
            name,
            sum(n for src, n in counts.items() if src in hit),
            sum(counts.values()),
        )
        for job_id, name, key, counts in reads.acquisitions_by_job(plan, _scope(flt), by_key=True)
    }


def address_failures_per_minute(flt: ChartFilter, plan: Plan) -> list[AddressFailureBucket]:
    bucket_s = flt.window.bucket_s
    return [
        AddressFailureBucket(
            bucket_start=bucket_start(b, bucket_s),
            bucket_s=bucket_s,
            sandboxes=n,
            address_failures=f,
            unknown=u,
        )
        for b, n, f, u in reads.address_failures(plan, bucket_s, _scope(flt))
    ]


def address_failures_by_node_load(flt: ChartFilter, plan: Plan) -> list[AddressFailureLoad]:
    return [
        AddressFailureLoad(node_load=load, sandboxes=n, address_failures=f, unknown=u)
        for load, n, f, u in reads.node_load(plan, flt.window.bucket_s, _scope(flt))
    ]
