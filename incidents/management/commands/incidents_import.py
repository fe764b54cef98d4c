"""``python manage.py incidents_import FILE``: import an export document, all or nothing.

Records whose ``uid`` exists replace that record; the rest are created. A bad record
stops the command with its index and nothing is written.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from incidents import records, services
from sandman_site.errors import SandmanError


class Command(BaseCommand):
    help = "Import incident records from a JSON export (FILE, or - for standard input)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("file")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            raw = (
                sys.stdin.read()
                if options["file"] == "-"
                else Path(options["file"]).read_text(encoding="utf-8")
            )
            payload = json.loads(raw)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CommandError(f"cannot read {options['file']}: {exc}") from exc
        try:
            parsed = records.parse_import(payload)
            result = services.incidents_import(records=parsed, recorded_by=None, now=timezone.now())
        except SandmanError as exc:
            raise CommandError(f"nothing imported: {exc.message}") from exc
        self.stdout.write(f"imported: {result.created} created, {result.updated} updated")
