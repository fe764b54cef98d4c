"""``manage.py refresh_rollups [--every SECONDS]``: bring every rollup up to date.

Advances the dashboard rollups' watermark and rebuilds their dirty buckets
(``rollups.refresh``), then stores the attribution of every learner step that has none
(``sandboxes.services.step_rollups``). Once by default (a backfill after ``seed_history``
or a migration); with ``--every`` it repeats until interrupted, the cheap periodic job a
deployment runs beside the server. ``--rebuild`` drops every rollup row first (after a change
to the bins). Prints what each pass did.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.utils import timezone

from rollups.refresh import rollups_refresh, rollups_reset
from sandboxes.services.step_rollups import step_attributions_refresh


class Command(BaseCommand):
    help = "Advance the rollups' watermark, rebuild dirty buckets, store step attributions."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--every", type=float, default=0.0)
        parser.add_argument(
            "--rebuild", action="store_true", help="drop every rollup row first, rebuild all"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        every = max(0.0, float(options["every"]))
        stop = threading.Event()
        if options["rebuild"]:
            rollups_reset()
        while True:
            began = time.monotonic()
            counts = rollups_refresh(now=timezone.now())
            steps = step_attributions_refresh(now=timezone.now())
            self.stdout.write(
                f"refresh_rollups: watermark {counts.watermark}, {counts.buckets} buckets "
                f"rebuilt ({counts.rows} rows), {steps} step attributions stored in "
                f"{time.monotonic() - began:.1f} s"
            )
            if not every or stop.wait(every):
                return
