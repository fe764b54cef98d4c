"""``manage.py seed_history --sandboxes N --trajectories M``: a month of records in bulk.

The distributions are ``dashboards.seeding.history``'s (the paper's, issue 11 item 6); the
writes are ``dashboards.seeding.writer``'s (``COPY`` on PostgreSQL). It ADDS to what the
database holds (new jobs owned by ``--owner``, created if missing), in one transaction, and
prints the row counts and the seconds it took. For benchmark and demo databases only.
"""

from __future__ import annotations

import time
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandParser
from django.db import transaction
from django.utils import timezone

from dashboards.seeding import history, writer
from sandboxes.models import Acquisition, Job, LearnerStep, Sandbox, Trajectory, TrajectoryPhase


class Command(BaseCommand):
    help = "Fill the database with a month of sandboxes, acquisitions, trajectories and steps."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--sandboxes", type=int, default=10_000)
        parser.add_argument("--trajectories", type=int, default=1_000)
        parser.add_argument("--jobs", type=int, default=60)
        parser.add_argument("--training-jobs", type=int, default=12)
        parser.add_argument("--seed", type=int, default=7)
        parser.add_argument("--owner", default="history")

    def handle(self, *args: Any, **options: Any) -> None:
        shape = history.HistoryShape(
            sandboxes=max(0, options["sandboxes"]),
            trajectories=max(0, options["trajectories"]),
            jobs=max(1, options["jobs"]),
            training_jobs=max(1, options["training_jobs"]),
            seed=options["seed"],
        )
        began, cpu = time.monotonic(), time.process_time()
        now = timezone.now().timestamp()
        counts = self._seed(shape, now=now, owner_name=options["owner"])
        elapsed, cpu = time.monotonic() - began, time.process_time() - cpu
        summary = ", ".join(
            f"{n} {name} ({self.seconds[name]:.1f} s)" for name, n in counts.items()
        )
        self.stdout.write(
            f"seed_history: {summary} in {elapsed:.1f} s ({cpu:.1f} s of this process's CPU)"
        )

    seconds: dict[str, float]

    def _write(self, counts: dict[str, int], name: str, model: Any, rows: Any) -> None:
        began = time.monotonic()
        counts[name] = writer.bulk_write(model, rows)
        self.seconds[name] = time.monotonic() - began

    @transaction.atomic
    def _seed(self, shape: history.HistoryShape, *, now: float, owner_name: str) -> dict:
        self.seconds = {}
        owner, _ = get_user_model().objects.get_or_create(username=owner_name)
        first_job = writer.next_id(Job)
        counts: dict[str, int] = {}
        jobs = history.job_rows(shape, first_id=first_job, owner_id=owner.pk, now=now)
        self._write(counts, "jobs", Job, jobs)
        pairs = history.sandbox_and_acquisition_rows(
            shape,
            first_sandbox_id=writer.next_id(Sandbox),
            first_acquisition_id=writer.next_id(Acquisition),
            first_job_id=first_job,
            now=now,
        )
        acquisitions: list[dict[str, Any]] = []

        def sandboxes() -> Any:
            for sandbox, acquisition in pairs:
                acquisitions.append(acquisition)
                yield sandbox

        self._write(counts, "sandboxes", Sandbox, sandboxes())
        self._write(counts, "acquisitions", Acquisition, acquisitions)
        del acquisitions[:]
        training = history.training_rows(
            shape,
            first_job_id=first_job,
            first_trajectory_id=writer.next_id(Trajectory),
            first_phase_id=writer.next_id(TrajectoryPhase),
            first_step_id=writer.next_id(LearnerStep),
            now=now,
        )
        self._write(counts, "trajectories", Trajectory, training.trajectories)
        self._write(counts, "phases", TrajectoryPhase, training.phases)
        self._write(counts, "learner steps", LearnerStep, training.steps)
        for model in (Job, Sandbox, Acquisition, Trajectory, TrajectoryPhase, LearnerStep):
            writer.reset_sequence(model)
        return counts
