"""The controller over the Kubernetes provider when the API server sheds or refuses creates.

Kubernetes only (the stand-in over real HTTP, a real execd per Ready pod): a 429 create is
resent and handed out with no DELETE; a 422 reaches the trainer as a 4xx naming the field,
with no retry; a 5xx create outcome is recorded with its HTTP status, so the create-error
detector (``incidents/detectors.py``) fires (issue 9, items 4 and 9).
"""

from __future__ import annotations

import datetime as dt

import pytest

from incidents.detectors import detect_create_errors
from sandboxes import events
from sandboxes.models import Sandbox, SandboxEvent
from sandboxes.tests.controller_support import acquire_args, make_job
from sandboxes.tests.ownership import backends
from sandman_site.errors import ProviderAmbiguous, ProviderError

backend = backends.backend  # the fixture, here only its [kubernetes] form


def _creates(backend) -> int:
    return backend.cluster.request_counts()[("create", "pods")]


@pytest.mark.parametrize("backend", ["kubernetes"], indirect=True)
def test_a_429_create_is_resent_and_handed_out_without_a_delete(backend):
    plan = backend.cluster.plans.add("create", "429", name_prefix="sm-", retry_after_s=0)
    controller = backend.controller()
    job = make_job()
    got = controller.acquire(**acquire_args(job))
    assert got.source == "created" and plan.fired == 1
    assert _creates(backend) == 2 and backend.cluster.request_counts()[("delete", "pods")] == 0
    assert Sandbox.objects.get(pk=got.sandbox_id).state == "in_use"
    assert not SandboxEvent.objects.filter(kind=events.CREATE_ERROR).exists()


@pytest.mark.parametrize("backend", ["kubernetes"], indirect=True)
def test_an_invalid_spec_is_a_422_to_the_trainer_naming_the_field_and_is_not_retried(backend):
    controller = backend.controller()
    job = make_job()
    with pytest.raises(ProviderError) as caught:
        controller.acquire(**acquire_args(job, image=" task/img:1"))
    controller.wait_idle()  # the create task settles the row after failing the waiter
    assert caught.value.status == 422 and caught.value.code == "provider_invalid"
    assert "spec.containers[0].image" in str(caught.value)
    assert _creates(backend) == 1
    (row,) = Sandbox.objects.filter(job=job)
    assert row.state in ("failed", "deleted")
    assert "spec.containers[0].image" in row.failure_reason


@pytest.mark.parametrize("backend", ["kubernetes"], indirect=True)
def test_a_5xx_create_is_recorded_with_its_status_and_the_detector_fires(backend, settings):
    settings.SANDMAN_DETECT_CREATE_ERROR_MIN = 1
    backend.cluster.plans.add("create", "500_before_store", name_prefix="sm-")
    controller = backend.controller()
    job = make_job()
    with pytest.raises(ProviderAmbiguous):
        controller.acquire(**acquire_args(job))
    controller.wait_idle()  # the create task records the outcome after failing the waiter
    (event,) = SandboxEvent.objects.filter(kind=events.CREATE_ERROR)
    assert event.detail["status"] == 500
    now = dt.datetime.now(dt.UTC)
    (incident,) = detect_create_errors(since=now - dt.timedelta(minutes=10), now=now)
    assert "5xx" in incident.title
