"""Grading models: tasks in the SWE-bench instance format, and the task sets that group them.

Rules a reader must not break:
* The SWE-bench fields (``instance_id`` … ``environment_setup_commit``) keep the datasets'
  meaning; ``fail_to_pass`` / ``pass_to_pass`` are always stored as JSON lists of test ids,
  whatever shape the input had (``grading/apis.py`` normalises both shapes).
* A task never changes after it is stored, except its state: a grading must be reproducible
  from the task row it names. State changes go through ``grading.services`` only
  (transition map in ``grading.states``).
"""

from __future__ import annotations

from django.conf import settings
from django.db import models

from grading.states import (
    CertificationState,
    GradingState,
    PreflightKind,
    TaskState,
    VerdictChoice,
)

# Suite time limit when a task does not give one: 1,800 s (a SWE-bench suite), NOT execd's
# 300 s default for a single command.
DEFAULT_SUITE_TIME_LIMIT_S = 1800.0
DEFAULT_TEST_COMMAND = "python -m pytest -rA"
# Test-configuration files left out of agent patches. A pattern without "/" matches a file
# of that name in any directory; one with "/" matches the path from the repository root.
DEFAULT_EXCLUDED_TEST_CONFIG = (
    "conftest.py",
    "pytest.ini",
    "tox.ini",
    "setup.cfg",
    "pyproject.toml",
    ".coveragerc",
)


def default_excluded_test_config() -> list[str]:
    return list(DEFAULT_EXCLUDED_TEST_CONFIG)


def default_suites() -> list[dict[str, object]]:
    return [
        {
            "name": "default",
            "command": DEFAULT_TEST_COMMAND,
            "time_limit_s": DEFAULT_SUITE_TIME_LIMIT_S,
        }
    ]


class Task(models.Model):
    """One grading task: a SWE-bench instance plus Sandman's image, suites and conditions."""

    # --- the SWE-bench instance format (SWE-bench, SWE-Gym and SWE-smith share it) ---------
    instance_id = models.CharField(max_length=200, unique=True)
    repo = models.CharField(max_length=200)
    base_commit = models.CharField(max_length=64)
    patch = models.TextField(help_text="the reference fix (a unified diff)")
    test_patch = models.TextField(blank=True, default="", help_text="the official tests")
    fail_to_pass = models.JSONField(help_text="test ids that the fix must make pass")
    pass_to_pass = models.JSONField(help_text="test ids that must keep passing")
    version = models.CharField(max_length=50, blank=True, default="")
    environment_setup_commit = models.CharField(max_length=64, blank=True, default="")
    problem_statement = models.TextField(blank=True, default="")
    # --- Sandman's fields --------------------------------------------------------------------
    image = models.CharField(max_length=500, help_text="a digest reference or a local image")
    suites = models.JSONField(
        default=default_suites, help_text="[{name, command, time_limit_s}] run in order"
    )
    conditions = models.JSONField(
        default=dict,
        help_text="declared run conditions; an absent field is not declared (§4.5)",
    )
    excluded_test_config = models.JSONField(default=default_excluded_test_config)
    state = models.CharField(max_length=16, choices=TaskState.choices, default=TaskState.ACTIVE)
    state_changed_at = models.DateTimeField()
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.PROTECT,
        related_name="sandman_tasks",
        null=True,
        blank=True,
    )
    created_at = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["state", "created_at"])]

    def __str__(self) -> str:
        return f"task {self.instance_id}"


class TaskSet(models.Model):
    """A named group of tasks (what preflight certifies and a job grades against)."""

    name = models.CharField(max_length=200, unique=True)
    description = models.TextField(blank=True, default="")
    tasks = models.ManyToManyField(Task, related_name="task_sets", blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.PROTECT,
        related_name="sandman_task_sets",
        null=True,
        blank=True,
    )
    created_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"task set {self.name}"


class PatchCapture(models.Model):
    """The agent's patch captured from a rollout sandbox (``POST /sandboxes/{id}/capture/``).

    ``sha256`` is over the patch's UTF-8 bytes; ``sandbox_id`` is kept as a plain id (no
    foreign key into the sandboxes app's tables, whose rows may be pruned).
    """

    task = models.ForeignKey(Task, on_delete=models.PROTECT, related_name="captures")
    job_id = models.BigIntegerField()
    sandbox_id = models.BigIntegerField()
    patch = models.TextField(blank=True)
    sha256 = models.CharField(max_length=64)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.PROTECT,
        related_name="sandman_captures",
        null=True,
        blank=True,
    )
    created_at = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["job_id", "created_at"])]

    def __str__(self) -> str:
        return f"capture {self.pk} of sandbox {self.sandbox_id}"


class Grading(models.Model):
    """One patch graded on one task for one job: stored as it progresses (§4.5).

    Rules a reader must not break: ``attempts`` only grows (one entry per sandbox tried,
    including one a restart lost); a grading reaches ``done`` exactly once, through
    ``grading.services``; an infrastructure failure is never stored as ``unresolved``.
    """

    job = models.ForeignKey("sandboxes.Job", on_delete=models.PROTECT, related_name="gradings")
    task = models.ForeignKey(Task, on_delete=models.PROTECT, related_name="gradings")
    capture = models.ForeignKey(
        PatchCapture, on_delete=models.PROTECT, null=True, blank=True, related_name="gradings"
    )
    patch = models.TextField(blank=True)
    patch_sha256 = models.CharField(max_length=64)
    suites = models.JSONField(help_text="the suites to run: [{name, command, time_limit_s}]")
    state = models.CharField(
        max_length=16, choices=GradingState.choices, default=GradingState.QUEUED
    )
    verdict = models.CharField(max_length=16, choices=VerdictChoice.choices, blank=True)
    reason = models.CharField(max_length=500, blank=True)
    tests = models.JSONField(default=dict, help_text="per-test status of the verdict's attempt")
    apply_step = models.CharField(max_length=64, blank=True)
    attempts = models.JSONField(default=list)
    max_attempts = models.PositiveSmallIntegerField(default=3)
    # Shadow grading (grading.shadow): the same patch graded again on a never-used sandbox
    # after the verdict; ``shadow`` holds its sandbox, source, verdict (or error), and
    # ``shadow_agrees`` whether it matched (None: not run, or no verdict).
    shadow_requested = models.BooleanField(default=False)
    shadow = models.JSONField(default=dict, blank=True)
    shadow_agrees = models.BooleanField(null=True, blank=True)
    runner = models.CharField(max_length=200, blank=True)
    # A preflight grading belongs to a certification and grades the reference or the empty
    # patch; a trainer's grading has neither.
    certification = models.ForeignKey(
        "Certification", on_delete=models.PROTECT, null=True, blank=True, related_name="gradings"
    )
    preflight_kind = models.CharField(max_length=16, choices=PreflightKind.choices, blank=True)
    lease_until = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.PROTECT,
        related_name="sandman_gradings",
        null=True,
        blank=True,
    )
    created_at = models.DateTimeField()
    state_changed_at = models.DateTimeField()
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["state", "created_at"]),
            models.Index(fields=["job", "verdict"]),
        ]

    def __str__(self) -> str:
        return f"grading {self.pk} of {self.task_id}"


class Certification(models.Model):
    """A task set's preflight under one job's grading configuration (§4.3, Appendix H).

    Rules a reader must not break: ``config`` / ``config_hash`` are the job's grading
    configuration when preflight started (``grading.certify.job_grading_config``);
    ``results`` holds, per task, EVERY preflight verdict (grading id, kind, verdict, reason),
    the task's digest and whether it was admitted; ``chain`` is the SHA-256 chain over the
    admitted tasks' digests in ``instance_id`` order, set once when the state becomes
    ``done``. Only ``grading.services`` writes it.
    """

    task_set = models.ForeignKey(TaskSet, on_delete=models.PROTECT, related_name="certifications")
    job = models.ForeignKey(
        "sandboxes.Job", on_delete=models.PROTECT, related_name="certifications"
    )
    state = models.CharField(
        max_length=16, choices=CertificationState.choices, default=CertificationState.RUNNING
    )
    config = models.JSONField(help_text="the job's grading configuration that was certified")
    config_hash = models.CharField(max_length=64)
    results = models.JSONField(default=dict, help_text="per instance_id: verdicts, admitted")
    admitted = models.JSONField(default=list, help_text="admitted instance_ids, in order")
    chain = models.CharField(max_length=64, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.PROTECT,
        related_name="sandman_certifications",
        null=True,
        blank=True,
    )
    created_at = models.DateTimeField()
    state_changed_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["task_set", "config_hash", "state"])]

    def __str__(self) -> str:
        return f"certification {self.pk} of {self.task_set_id}"
