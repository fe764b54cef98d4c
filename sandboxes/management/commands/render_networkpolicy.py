"""``python manage.py render_networkpolicy``: print the egress-allow NetworkPolicy as YAML.

The ranges come from ``--pod-cidr`` / ``--service-cidr`` (repeatable), else from
``SANDMAN_K8S_POD_CIDRS`` / ``SANDMAN_K8S_SERVICE_CIDRS``; the namespace from
``--namespace``, else ``SANDMAN_NAMESPACE``. ``k8s/networkpolicies.yaml`` holds the render
with the defaults; pipe this into ``kubectl apply -f -`` for a cluster with other ranges.
"""

from __future__ import annotations

from typing import Any

import yaml
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from sandboxes.providers.kubernetes.config import config_from_settings
from sandboxes.providers.kubernetes.netpolicy import egress_allow_policy


def _split(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


class Command(BaseCommand):
    help = "Print the NetworkPolicy of egress-allowed sandboxes (outside world only)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--namespace", default=None)
        parser.add_argument("--pod-cidr", action="append", default=None)
        parser.add_argument("--service-cidr", action="append", default=None)

    def handle(self, *args: Any, **options: Any) -> None:
        namespace = options["namespace"] or config_from_settings(settings).namespace
        pods = options["pod_cidr"] or _split(settings.SANDMAN_K8S_POD_CIDRS)
        services = options["service_cidr"] or _split(settings.SANDMAN_K8S_SERVICE_CIDRS)
        try:
            policy = egress_allow_policy(namespace, pod_cidrs=pods, service_cidrs=services)
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(yaml.safe_dump(policy, sort_keys=False), ending="")
