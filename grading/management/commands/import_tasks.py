"""``python manage.py import_tasks FILE.jsonl [--task-set NAME]``: import tasks, all or nothing.

One JSON object per line in the SWE-bench instance format (plus Sandman's fields), read by
the same serializer as ``POST /api/v1/tasks/``. Rule a reader must not break: every line is
validated BEFORE anything is written, and the write is one transaction — a malformed line
stops the command with its line number and nothing of the file is stored.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from grading import services
from grading.apis import TaskCreateApi
from sandman_site.api_errors import describe_validation_error
from sandman_site.errors import SandmanError

MAX_LINES = 100_000


def parse_task_lines(text: str) -> list[dict[str, Any]]:
    """Validate every non-blank line; the first bad one raises ``CommandError`` with its number."""
    tasks: list[dict[str, Any]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        if len(tasks) >= MAX_LINES:
            raise CommandError(f"line {number}: more than {MAX_LINES} tasks in one file")
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise CommandError(
                f"line {number}: not JSON ({exc.msg} at column {exc.colno})"
            ) from exc
        if not isinstance(obj, dict):
            raise CommandError(f"line {number}: a task is a JSON object, got {type(obj).__name__}")
        data = TaskCreateApi.InputSerializer(data=obj)
        if not data.is_valid():
            detail = describe_validation_error(data.errors)
            raise CommandError(f"line {number}: {obj.get('instance_id', '?')}: {detail}")
        tasks.append(data.validated_data)
    return tasks


class Command(BaseCommand):
    help = "Import tasks from a JSONL file (SWE-bench instance format), all or nothing."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("file", help="a .jsonl file, or - for standard input")
        parser.add_argument("--task-set", help="also group the imported tasks under this name")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            text = (
                sys.stdin.read()
                if options["file"] == "-"
                else Path(options["file"]).read_text(encoding="utf-8")
            )
        except (OSError, UnicodeDecodeError) as exc:
            raise CommandError(f"cannot read {options['file']}: {exc}") from exc
        tasks = parse_task_lines(text)
        if not tasks:
            raise CommandError(f"{options['file']}: no tasks (every line is blank)")
        try:
            stored = services.task_import(
                created_by=None, now=timezone.now(), tasks=tasks, task_set=options["task_set"]
            )
        except SandmanError as exc:
            raise CommandError(f"nothing imported: {exc.message}") from exc
        where = f" into task set {options['task_set']!r}" if options["task_set"] else ""
        self.stdout.write(f"imported {len(stored)} tasks{where}")
