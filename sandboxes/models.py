"""Jobs, sandboxes (pods), their event timelines, acquisitions and pending deletes.

Everything that must survive a restart of the controller lives here: a sandbox row
exists BEFORE its create is sent (state ``requested``, with its name and nonce), so a
restart can always find, adopt or delete what the backend holds. State changes go
through ``sandboxes.services`` only (transition maps in ``sandboxes.states``).
"""

from __future__ import annotations

import secrets

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.db.models.functions import Coalesce

from sandboxes.states import (
    AcquisitionOutcome,
    Egress,
    JobState,
    Role,
    SandboxSource,
    SandboxState,
)


def new_execd_key() -> str:
    """A job's execd key: 32 random bytes in hex. A sandbox's token is
    HMAC-SHA256(key, sandbox name) (``execd/tokens.py``)."""
    return secrets.token_hex(32)


class Job(models.Model):
    """A training job: the owner of one pool and of every sandbox it creates.

    ``execd_key`` is a secret: it is in no API answer, list, log, page or the admin (its
    tokens are derived on the sandbox rows; on Kubernetes it travels in the job's Secret).
    """

    name = models.CharField(max_length=200)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="sandman_jobs"
    )
    state = models.CharField(max_length=16, choices=JobState.choices, default=JobState.ACTIVE)
    trainer_pod_name = models.CharField(max_length=253, blank=True, default="")
    trainer_pod_uid = models.CharField(max_length=64, blank=True, default="")
    # Pacing: a token bucket per job (creates per second, burst).
    rate_per_s = models.FloatField(default=25.0)
    burst = models.PositiveIntegerField(default=25)
    max_live = models.PositiveIntegerField(default=256)
    max_creating = models.PositiveIntegerField(default=64)
    warm_per_key = models.PositiveIntegerField(default=0)
    idle_timeout_s = models.FloatField(default=300.0)
    readiness_budget_s = models.FloatField(default=120.0)
    max_lifetime_s = models.FloatField(default=1800.0)
    egress = models.CharField(max_length=8, choices=Egress.choices, default=Egress.DENY)
    reuse_enabled = models.BooleanField(default=False)
    reuse_max_uses = models.PositiveIntegerField(default=8)
    # Opt-in: warm and reused grading sandboxes of tag-referenced images (sandboxes.imagerefs).
    reuse_allow_tags = models.BooleanField(default=False)
    # Placement (sandboxes.placement): a node pool by its label's value (empty: the
    # service's default pool) and other node labels; never an instance type (Table A14).
    node_pool = models.CharField(max_length=63, blank=True, default="")
    node_selector = models.JSONField(default=dict, blank=True)
    # A bash script execd runs first in every session's shell of the job's sandboxes (the
    # BASH_ENV / ``conda activate`` case); empty: none.
    startup_script = models.TextField(blank=True, default="")
    created_at = models.DateTimeField()
    drained_at = models.DateTimeField(null=True, blank=True)
    execd_key = models.CharField(max_length=64, default=new_execd_key, editable=False)

    class Meta:
        indexes = [models.Index(fields=["owner", "state"])]

    def __str__(self) -> str:
        return f"job {self.pk} {self.name}"


class Sandbox(models.Model):
    """One sandbox (a pod on Kubernetes, an execd process locally)."""

    job = models.ForeignKey(Job, on_delete=models.PROTECT, related_name="sandboxes")
    name = models.CharField(max_length=63, unique=True)
    nonce = models.CharField(max_length=64)
    token = models.CharField(max_length=128)
    backend = models.CharField(max_length=16)
    backend_uid = models.CharField(max_length=64, blank=True, default="")
    backend_ref = models.CharField(max_length=512, blank=True, default="")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.ROLLOUT)
    state = models.CharField(
        max_length=16, choices=SandboxState.choices, default=SandboxState.REQUESTED
    )
    source = models.CharField(max_length=16, choices=SandboxSource.choices, blank=True, default="")
    image = models.CharField(max_length=512)
    base_commit = models.CharField(max_length=64, blank=True, default="")
    cpu_millis = models.PositiveIntegerField()
    memory_bytes = models.BigIntegerField()
    workspace_bytes = models.BigIntegerField(null=True, blank=True)
    key_hash = models.CharField(max_length=32)
    egress = models.CharField(max_length=8, choices=Egress.choices, default=Egress.DENY)
    address = models.CharField(max_length=128, blank=True, default="")
    node = models.CharField(max_length=253, blank=True, default="")
    guards = models.JSONField(default=dict, blank=True)
    reuse_count = models.PositiveIntegerField(default=0)
    # None: unknown (no core/v1 Event told; they are rate-limited and expire), not 0.
    address_failures = models.PositiveIntegerField(default=0, null=True, blank=True)
    image_present = models.BooleanField(null=True, blank=True)
    pull_ms = models.FloatField(null=True, blank=True)
    failure_reason = models.TextField(blank=True, default="")
    # Set once an agent had it: such a sandbox is never made warm again.
    agent_used = models.BooleanField(default=False)
    # Checked reuse: verdicts seen on this pod, {"<patch_sha256>:<suite>": "pass"|"fail"}.
    reuse_verdicts = models.JSONField(default=dict, blank=True)
    # Timestamps of docs/architecture.md §8 (those the backend can know).
    requested_at = models.DateTimeField()
    api_created_at = models.DateTimeField(null=True, blank=True)
    scheduled_at = models.DateTimeField(null=True, blank=True)
    address_assigned_at = models.DateTimeField(null=True, blank=True)
    image_pulled_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    ready_at = models.DateTimeField(null=True, blank=True)
    healthy_at = models.DateTimeField(null=True, blank=True)
    acquired_at = models.DateTimeField(null=True, blank=True)
    # Seconds past the job's max_lifetime_s granted by renew (the reclaim adds them).
    lifetime_extra_s = models.FloatField(default=0.0)
    released_at = models.DateTimeField(null=True, blank=True)
    deleting_at = models.DateTimeField(null=True, blank=True)
    deleted_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)
    # Set while the controller offers this warm pod to the web workers' direct hand-out
    # (sandboxes/offers.py): whoever moves an offered row first owns the pod.
    offered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["job", "state"]),
            models.Index(fields=["state", "key_hash"]),
            models.Index(fields=["ready_at"]),
            models.Index(fields=["requested_at"]),
            models.Index(fields=["backend", "state"]),
            # The operations page buckets by "scheduled, else requested" (issue 11 item 6).
            models.Index(
                Coalesce("scheduled_at", "requested_at"), name="sandbox_scheduled_or_requested"
            ),
            # Idle warm pod-hours (operations page): an index-only scan of the warm sandboxes,
            # a month of them without reading the table (dashboards.selectors.operations).
            models.Index(
                fields=["ready_at"],
                include=["job", "key_hash", "backend", "acquired_at", "deleted_at"],
                condition=Q(source__in=("", "warm"), ready_at__isnull=False),
                name="sandbox_warm_idle",
            ),
            # The direct hand-out's claim: the oldest offered pod of a job's key.
            # In the claim's order (offered_at, id): a claim reads one entry, not every
            # offered pod of its key, and sorts nothing (sandboxes.services.offers).
            models.Index(
                fields=["job", "key_hash", "offered_at", "id"],
                condition=Q(state="ready", offered_at__isnull=False),
                name="sandbox_offered_order",
            ),
        ]

    def __str__(self) -> str:
        return self.name


class SandboxEvent(models.Model):
    """One entry of a sandbox's timeline (state changes, failures, reclaim, health)."""

    sandbox = models.ForeignKey(Sandbox, on_delete=models.CASCADE, related_name="events")
    at = models.DateTimeField()
    kind = models.CharField(max_length=48)
    detail = models.JSONField(default=dict, blank=True)

    class Meta:
        indexes = [models.Index(fields=["sandbox", "at"]), models.Index(fields=["kind", "at"])]
        ordering = ["at", "id"]


class Acquisition(models.Model):
    """One acquire call: its queue wait (pacer), create time, total and outcome."""

    job = models.ForeignKey(Job, on_delete=models.PROTECT, related_name="acquisitions")
    sandbox = models.ForeignKey(
        Sandbox, on_delete=models.SET_NULL, null=True, blank=True, related_name="acquisitions"
    )
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
    )
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.ROLLOUT)
    image = models.CharField(max_length=512)
    key_hash = models.CharField(max_length=32)
    outcome = models.CharField(
        max_length=16, choices=AcquisitionOutcome.choices, default=AcquisitionOutcome.PENDING
    )
    source = models.CharField(max_length=16, choices=SandboxSource.choices, blank=True, default="")
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    queue_ms = models.FloatField(null=True, blank=True)
    create_ms = models.FloatField(null=True, blank=True)
    wait_ms = models.FloatField(null=True, blank=True)
    detail = models.TextField(blank=True, default="")
    # The REST call's Idempotency-Key (empty without one): a retry after a restart finds the
    # sandbox this acquire was handed (sandboxes.services.recovery).
    idempotency_key = models.CharField(max_length=200, blank=True, default="")

    class Meta:
        indexes = [
            models.Index(
                fields=["job", "idempotency_key"],
                name="acq_job_idem_key",
                condition=models.Q(idempotency_key__gt=""),
            ),
            models.Index(fields=["job", "started_at"]),
            models.Index(fields=["outcome", "started_at"]),
            models.Index(fields=["started_at"]),
            # The dashboards window acquisitions by when they finished (issue 11 item 6).
            models.Index(fields=["finished_at"]),
        ]


class PendingDelete(models.Model):
    """A delete not yet confirmed by the backend; the controller retries until it is.

    Written in the same transaction that moves a sandbox to ``deleting`` (or when an
    ambiguous create left an identity), removed only once the backend confirms.
    """

    name = models.CharField(max_length=63, unique=True)
    backend = models.CharField(max_length=16)
    backend_uid = models.CharField(max_length=64, blank=True, default="")
    # The backend's private locator (a pid and path locally), so a restart can delete it.
    backend_ref = models.CharField(max_length=512, blank=True, default="")
    nonce = models.CharField(max_length=64, blank=True, default="")
    sandbox = models.ForeignKey(
        Sandbox, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    reason = models.CharField(max_length=64)
    attempts = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True, default="")
    created_at = models.DateTimeField()
    next_attempt_at = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["next_attempt_at"])]

    def __str__(self) -> str:
        return f"pending delete {self.name} ({self.attempts} attempts)"


class PhaseKind(models.TextChoices):
    """Phases of a trajectory (issue 11 wire format; ``sandboxes.critical_path.PHASE_KINDS``)."""

    ROLLOUT_ACQUISITION = "rollout_acquisition", "rollout acquisition"
    GENERATION = "generation", "generation"
    COMMANDS = "commands", "commands"
    CAPTURE = "capture", "capture"
    GRADING_ACQUISITION = "grading_acquisition", "grading acquisition"
    TESTS = "tests", "tests"
    RELEASE = "release", "release"


class Trajectory(models.Model):
    """One attempt at a rollout as the trainer reported it (Appendix J's per-trajectory record).

    Times are float seconds since the Unix epoch, as on the wire: the attribution subtracts
    them and a double keeps well under a microsecond at today's epoch. ``trainer_id`` is the
    trainer's id, unique per job: a repeated id is a duplicate and changes nothing.
    """

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="trajectories")
    trainer_id = models.CharField(max_length=200)
    slot = models.PositiveIntegerField()
    group = models.CharField(max_length=200)
    start = models.FloatField()
    end = models.FloatField()
    failed = models.BooleanField(default=False)
    predecessor = models.CharField(max_length=200, blank=True, default="")
    sandbox_ids = models.JSONField(default=list, blank=True)
    received_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["job", "trainer_id"], name="trajectory_job_trainer_id")
        ]
        indexes = [
            models.Index(fields=["job", "end"]),
            models.Index(fields=["job", "group"]),
            # The last occupant of each slot before a range: one index probe per slot.
            models.Index(fields=["job", "slot", "end"]),
        ]


class TrajectoryPhase(models.Model):
    """One phase of a trajectory; ``from_sandman`` when Sandman's own acquisition times won."""

    trajectory = models.ForeignKey(Trajectory, on_delete=models.CASCADE, related_name="phases")
    kind = models.CharField(max_length=24, choices=PhaseKind.choices)
    start = models.FloatField()
    end = models.FloatField()
    from_sandman = models.BooleanField(default=False)

    class Meta:
        indexes = [
            models.Index(fields=["trajectory", "start"]),
            # Waiting share and Little's law sum only acquisition phases: an index-only probe
            # per trajectory instead of every phase (issue 11 item 6).
            models.Index(
                fields=["trajectory"],
                include=["start", "end", "from_sandman"],
                condition=models.Q(kind__in=["rollout_acquisition", "grading_acquisition"]),
                name="phase_acquisition_traj",
            ),
        ]


class LearnerStep(models.Model):
    """One learner step: the wait for complete groups, the hand-over, training (Appendix J)."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="learner_steps")
    step = models.PositiveIntegerField()
    wait_start = models.FloatField()
    wait_end = models.FloatField()
    handover_end = models.FloatField(null=True, blank=True)
    train_end = models.FloatField()
    groups = models.JSONField(default=list)
    dropped_groups = models.JSONField(default=list, blank=True)
    received_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["job", "step"], name="learner_step_job_step")
        ]
        indexes = [models.Index(fields=["job", "wait_start"])]


class IdempotentCall(models.Model):
    """The recorded answer of a REST call sent with an ``Idempotency-Key``: a retry with
    the same key on the same route and scope (a job's acquire, a sandbox's release) gets
    this answer instead of a second effect. Never holds a token (a replayed acquire reads
    it from the sandbox row). Rows older than ``IDEMPOTENCY_TTL_S`` may be pruned."""

    route = models.CharField(max_length=16)
    scope = models.BigIntegerField()  # the job id (acquire) or the sandbox id (release)
    key = models.CharField(max_length=200)
    sandbox_id = models.BigIntegerField(null=True, blank=True)
    answer = models.JSONField(default=dict)
    created_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["route", "scope", "key"], name="idempotent_call_route_scope_key"
            )
        ]
        indexes = [models.Index(fields=["created_at"])]


class SubnetSample(models.Model):
    """One reading of a subnet's free pod addresses (``sandboxes.addresses``): the gauge
    ``sandman_subnet_free_addresses`` and the /operations/ chart read these."""

    at = models.DateTimeField()
    subnet_id = models.CharField(max_length=64)
    zone = models.CharField(max_length=64, blank=True, default="")
    available = models.PositiveIntegerField()
    floor = models.PositiveIntegerField(default=0)

    class Meta:
        indexes = [models.Index(fields=["at"]), models.Index(fields=["subnet_id", "at"])]


class AddressFloorChange(models.Model):
    """The pool stopped creating (``closed``) because a subnet fell under the address
    floor, or started again: an event on /operations/ and a detector's draft incident."""

    at = models.DateTimeField()
    closed = models.BooleanField()
    subnet_id = models.CharField(max_length=64, blank=True, default="")
    available = models.PositiveIntegerField(default=0)
    floor = models.PositiveIntegerField(default=0)

    class Meta:
        indexes = [models.Index(fields=["at"])]


class StepAttributionRollup(models.Model):
    """A learner step's stored Appendix J attribution: derived data, never the source of truth.

    Written by ``sandboxes.services.step_rollups`` (the periodic ``refresh_rollups`` job and
    backfills) from the raw trajectories, phases and steps; deleted when a late trajectory
    could change it (``trajectories_report`` invalidates in the same transaction). A step
    without a row is attributed from raw rows at read time, so a read never sees a stale one.
    """

    step = models.OneToOneField(
        LearnerStep, on_delete=models.CASCADE, primary_key=True, related_name="attribution"
    )
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="+")
    train_end = models.FloatField()
    # {category: seconds} over sandboxes.critical_path.CATEGORIES; adds up to the interval.
    seconds = models.JSONField(default=dict)
    ended_by = models.CharField(max_length=200, blank=True, default="")
    computed_at = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["job", "train_end"])]
