"""``python manage.py sample_tasks [--images-dir DIR] [--write-jsonl] [--import]``.

Builds the six sample repositories of ``sample_tasks/`` into local images
(``SANDMAN_IMAGES_DIR/sandman-sample/NAME``, see ``grading.samples``) and checks each base
commit against the shipped ``sample_tasks/tasks.jsonl``. ``--write-jsonl`` rewrites that file
from the build (after editing a sample); ``--import`` also stores the tasks (all or nothing,
through ``import_tasks``'s reader) in the task set ``sandman-sample``, skipping it when every
task is already stored.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from grading import samples, services
from grading.management.commands.import_tasks import parse_task_lines
from grading.models import Task
from sandman_site.errors import SandmanError


class Command(BaseCommand):
    help = "Build the sample task set's local images (and optionally import its tasks)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--images-dir", help="default: SANDMAN_IMAGES_DIR")
        parser.add_argument(
            "--write-jsonl", action="store_true", help="rewrite sample_tasks/tasks.jsonl"
        )
        parser.add_argument(
            "--import", dest="do_import", action="store_true", help="store the tasks too"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        images_dir = Path(options["images_dir"] or settings.SANDMAN_IMAGES_DIR)
        try:
            built = samples.build_all(images_dir)
        except (samples.SampleBuildError, OSError) as exc:
            raise CommandError(f"could not build the sample images: {exc}") from exc
        text = samples.jsonl_text(built)
        if options["write_jsonl"]:
            samples.JSONL_PATH.write_text(text, encoding="utf-8")
            self.stdout.write(f"wrote {samples.JSONL_PATH}")
        elif samples.JSONL_PATH.read_text(encoding="utf-8") != text:
            raise CommandError(
                f"{samples.JSONL_PATH} does not match the build (a sample changed?); "
                "rerun with --write-jsonl"
            )
        for sample in built:
            self.stdout.write(f"{sample.image}: {sample.base_commit} ({sample.path})")
        if options["do_import"]:
            self._import(text)

    def _import(self, text: str) -> None:
        tasks = parse_task_lines(text)
        ids = [t["instance_id"] for t in tasks]
        if Task.objects.filter(instance_id__in=ids).count() == len(ids):
            self.stdout.write(f"task set {samples.TASK_SET!r}: already imported")
            return
        try:
            services.task_import(
                created_by=None, now=timezone.now(), tasks=tasks, task_set=samples.TASK_SET
            )
        except SandmanError as exc:
            raise CommandError(f"nothing imported: {exc.message}") from exc
        self.stdout.write(f"imported {len(tasks)} tasks into task set {samples.TASK_SET!r}")
