"""``manage.py standin_cluster``: a thin wrapper over ``python -m standin`` (``standin.cli``).

The stand-in cluster is a top-level package of the source tree that never ships in the
wheel; this command only adds Sandman's namespace (``SANDMAN_NAMESPACE``) as the
kubeconfig's default. Where the package is not importable (an installed wheel without the
source tree) the command fails with a :class:`CommandError` that says so.

Invariant: nothing in ``sandboxes`` imports ``standin`` at module level -- this command
loads it when it runs, and nothing else in the service loads it at all.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

MISSING = (
    "the stand-in cluster (the top-level `standin` package) is not importable: it lives in "
    "Sandman's source tree and is not part of the installed wheel; run this command from a "
    "checkout of the repository"
)


def load_cli() -> ModuleType:
    """``standin.cli``, or a CommandError if the ``standin`` package is not there."""
    try:
        return importlib.import_module("standin.cli")
    except ModuleNotFoundError as exc:
        if exc.name not in ("standin", "standin.cli"):
            raise  # the package is there but broken: show the real error
        raise CommandError(MISSING) from exc


class Command(BaseCommand):
    help = "Serve a stand-in Kubernetes cluster (pods API, scheduler, kubelet) for rehearsal."

    def add_arguments(self, parser: CommandParser) -> None:
        self.missing: CommandError | None = None
        try:
            load_cli().add_arguments(parser)
        except CommandError as exc:
            # Report it from handle(), after parsing, so it is printed as a CommandError
            # and not lost behind argparse rejecting the stand-in's options as unknown.
            self.missing = exc
            _accept_any_arguments(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        if self.missing is not None:
            raise self.missing

        def say(line: str) -> None:
            self.stdout.write(line)
            self.stdout.flush()

        namespace = getattr(settings, "SANDMAN_NAMESPACE", "default")
        load_cli().run(options, say, namespace=namespace)


def _accept_any_arguments(parser: CommandParser) -> None:
    parse_known = parser.parse_known_args

    def parse_args(
        args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> argparse.Namespace:
        return parse_known(args, namespace)[0]

    parser.parse_args = parse_args  # type: ignore[assignment]
