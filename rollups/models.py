"""The rollup tables: per-bucket aggregates of the raw sandbox and acquisition rows.

Derived data only; the raw rows are the source of truth and every number here is what a
GROUP BY over them gives (``rollups.refresh`` writes them with that very SQL). A bucket is
:data:`BUCKET_S` seconds counted from the epoch (``bucket`` is its index).

What a reader must not break (``rollups.plan`` does it for the selectors):

* Only buckets below :class:`RollupState`'s ``watermark`` and not listed in
  :class:`RollupDirty` may be read from here; every other bucket is read from the raw rows.
* PostgreSQL triggers (migration ``0001``) list a bucket in ``RollupDirty`` whenever a raw
  row with a time in it (old or new value) is inserted, changed or deleted below the
  watermark, in the writer's own transaction: a late row, a row moved across a bucket
  boundary, a value changed after the refresh. The refresh recomputes and unlists them.
* ``backend`` is ``""`` where a row has none (an acquisition that got no sandbox). In
  :class:`CreateRollup` a NULL ``job`` or ``""`` backend means "all" (grouping sets); in
  the tables with a nullable ``job_id`` a NULL job is the all-jobs row of its backend and
  backend ``"*"`` means all backends (``rollups.families.ALL``).
"""

from __future__ import annotations

from django.db import models

BUCKET_S = 1800


class RollupState(models.Model):
    """One row: buckets below ``watermark`` have been materialised (unless listed dirty)."""

    watermark = models.BigIntegerField(default=0)
    refreshed_at = models.DateTimeField(null=True, blank=True)


class RollupDirty(models.Model):
    """A bucket whose raw rows changed after it was materialised: read raw, recompute."""

    bucket = models.BigIntegerField(primary_key=True)
    marks = models.BigIntegerField(default=1)


class ReadyRollup(models.Model):
    """Sandboxes Ready in the bucket (``ready_at >= requested_at``) by create-to-Ready bin."""

    bucket = models.BigIntegerField()
    job_id = models.BigIntegerField(null=True)
    backend = models.CharField(max_length=16)
    image = models.CharField(max_length=8)  # present | pulled | unknown
    bin = models.IntegerField()
    n = models.BigIntegerField()

    class Meta:
        indexes = [models.Index(fields=["job_id", "backend", "bucket"])]


class CreateRollup(models.Model):
    """Creates requested in the bucket and the busiest second, per (job|all, backend|all)."""

    bucket = models.BigIntegerField()
    job_id = models.BigIntegerField(null=True)
    backend = models.CharField(max_length=16)
    n = models.BigIntegerField()
    peak_per_s = models.BigIntegerField()

    class Meta:
        indexes = [models.Index(fields=["job_id", "backend", "bucket"])]


class NodeRollup(models.Model):
    """Sandboxes requested in the bucket per node (node known): count and address failures."""

    bucket = models.BigIntegerField()
    job_id = models.BigIntegerField(null=True)
    backend = models.CharField(max_length=16)
    node = models.CharField(max_length=253)
    n = models.BigIntegerField()
    failures = models.BigIntegerField()
    unknown = models.BigIntegerField()

    class Meta:
        indexes = [models.Index(fields=["job_id", "backend", "bucket"])]


class AddressRollup(models.Model):
    """Sandboxes by the bucket of ``scheduled_at`` (else ``requested_at``): address failures."""

    bucket = models.BigIntegerField()
    job_id = models.BigIntegerField(null=True)
    backend = models.CharField(max_length=16)
    n = models.BigIntegerField()
    failures = models.BigIntegerField()
    unknown = models.BigIntegerField()

    class Meta:
        indexes = [models.Index(fields=["job_id", "backend", "bucket"])]


class AcquisitionRollup(models.Model):
    """Acquisitions finished in the bucket by outcome, source and key."""

    bucket = models.BigIntegerField()
    job_id = models.BigIntegerField()
    backend = models.CharField(max_length=16)
    key_hash = models.CharField(max_length=32)
    outcome = models.CharField(max_length=16)
    source = models.CharField(max_length=16)
    n = models.BigIntegerField()

    class Meta:
        indexes = [models.Index(fields=["job_id", "backend", "bucket"])]


class WaitRollup(models.Model):
    """Acquisitions finished in the bucket by bin of ``wait_ms`` or of ``queue_ms``."""

    bucket = models.BigIntegerField()
    job_id = models.BigIntegerField(null=True)
    backend = models.CharField(max_length=16)
    metric = models.CharField(max_length=8)  # wait | queue
    bin = models.IntegerField()
    n = models.BigIntegerField()

    class Meta:
        indexes = [models.Index(fields=["job_id", "backend", "bucket"])]
