"""``python manage.py preflight TASKSET --job JOB [--wait] [--timeout S]``: certify a task set.

Starts a certification of TASKSET (a name or an id) under JOB's grading configuration
(``grading.services.certifications``) and shows a progress bar until every task is admitted
or rejected, then prints the record. By default the command grades itself: it starts a
controller (no sweep) and a grading runner limited to this certification's gradings. With
``--wait`` it only watches while the service's own runner grades (use that when
``scripts/serve`` or the service is running over the same sandbox root). Exit status 0 when
the record is done (whatever it admitted), 1 on a timeout.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from grading import services
from grading.models import Certification, Grading, TaskSet
from grading.runner import GradingRunner
from grading.states import CertificationState, GradingState
from sandboxes.models import Job
from sandman_site.errors import SandmanError

BAR_WIDTH = 30


def progress_line(cert: Certification) -> str:
    """``[#####.....] 3/6 tasks decided, 2 admitted, 1 rejected, 7 gradings done``."""
    results = cert.results.values()
    decided = sum(1 for r in results if r["admitted"] is not None)
    admitted = sum(1 for r in results if r["admitted"])
    total = max(len(cert.results), 1)
    filled = round(BAR_WIDTH * decided / total)
    done = Grading.objects.filter(certification=cert, state=GradingState.DONE).count()
    return (
        f"[{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {decided}/{len(cert.results)} tasks "
        f"decided, {admitted} admitted, {decided - admitted} rejected, {done} gradings done"
    )


class Command(BaseCommand):
    help = "Preflight a task set under a job's configuration and store its certification."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("task_set", help="task set name or id")
        parser.add_argument("--job", type=int, required=True, help="the job whose configuration")
        parser.add_argument(
            "--wait", action="store_true", help="let the running service's runner grade"
        )
        parser.add_argument("--timeout", type=float, default=3600.0, help="seconds (default 3600)")

    def handle(self, *args: Any, **options: Any) -> None:
        task_set = self._task_set(options["task_set"])
        job = Job.objects.filter(pk=options["job"]).first()
        if job is None:
            raise CommandError(f"no job {options['job']}")
        try:
            cert = services.certification_start(
                task_set=task_set, job=job, created_by=None, now=timezone.now()
            )
        except SandmanError as exc:
            raise CommandError(f"preflight not started: {exc.message}") from exc
        self.stdout.write(
            f"certification {cert.pk} of task set {task_set.name!r} for job {job.pk} "
            f"({len(cert.results)} tasks, configuration {cert.config_hash[:12]})"
        )
        if options["wait"]:
            finished = self._watch(cert, options["timeout"], runner=None)
        else:
            finished = self._grade_here(cert, options["timeout"])
        cert.refresh_from_db()
        self._report(cert)
        if not finished:
            raise CommandError(f"certification {cert.pk} not done after {options['timeout']:g} s")

    def _task_set(self, ref: str) -> TaskSet:
        found = TaskSet.objects.filter(name=ref).first()
        if found is None and ref.isdigit():
            found = TaskSet.objects.filter(pk=int(ref)).first()
        if found is None:
            raise CommandError(f"no task set {ref!r}")
        return found

    def _grade_here(self, cert: Certification, timeout_s: float) -> bool:
        from sandman_site.wiring import build_controller

        controller = build_controller(sweep_interval_s=0)
        controller.start()
        try:
            runner = GradingRunner(controller=controller, certification_id=cert.pk)
            return self._watch(cert, timeout_s, runner=runner)
        finally:
            controller.stop()

    def _watch(self, cert: Certification, timeout_s: float, runner: GradingRunner | None) -> bool:
        deadline = time.monotonic() + timeout_s
        idle = threading.Event()
        while time.monotonic() < deadline:
            if runner is not None:
                worked = runner.run_once()  # also advances the certification
            else:
                worked = False
            cert.refresh_from_db()
            self._bar(cert)
            if cert.state == CertificationState.DONE:
                self.stderr.write("")
                return True
            if not worked:
                idle.wait(1.0)  # poll the stored record again
        self.stderr.write("")
        return False

    def _bar(self, cert: Certification) -> None:
        line = progress_line(cert)
        if sys.stderr.isatty():
            self.stderr.write("\r" + line, ending="")
        else:
            self.stderr.write(line)
        self.stderr.flush()

    def _report(self, cert: Certification) -> None:
        for instance_id, result in sorted(cert.results.items()):
            mark = {True: "admitted", False: "REJECTED", None: "undecided"}[result["admitted"]]
            runs = ", ".join(f"{v['kind']}={v['verdict']}" for v in result["verdicts"])
            self.stdout.write(f"  {mark:9} {instance_id}: {result['reason']} [{runs}]")
        self.stdout.write(
            f"certification {cert.pk}: {cert.state}, {len(cert.admitted)} of "
            f"{len(cert.results)} admitted, chain {cert.chain or '-'}"
        )
