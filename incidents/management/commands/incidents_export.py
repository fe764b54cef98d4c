"""``python manage.py incidents_export FILE``: every incident as one JSON document.

The document is what ``incidents_import`` and ``POST /api/v1/incidents/import/`` accept.
``-`` writes to standard output. The file is written whole or not at all (temp + rename).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.utils import timezone
from rest_framework.utils.encoders import JSONEncoder

from incidents import selectors
from incidents.exports import export_document


class Command(BaseCommand):
    help = "Export every incident record as JSON (FILE, or - for standard output)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("file")

    def handle(self, *args: Any, **options: Any) -> None:
        document = export_document(selectors.export_queryset(), now=timezone.now())
        text = json.dumps(document, cls=JSONEncoder, indent=2, ensure_ascii=False) + "\n"
        if options["file"] == "-":
            self.stdout.write(text, ending="")
            return
        target = Path(options["file"])
        fd, tmp = tempfile.mkstemp(dir=target.parent or ".", prefix=f".{target.name}.")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(text)
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        count = len(document["incidents"])
        self.stderr.write(f"exported {count} incident(s) to {target}")
