"""Stored step attributions (``services.step_rollups``) give the raw attribution's numbers,
and a late trajectory that changes a step deletes its stored row in the same transaction."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from sandboxes.models import LearnerStep, StepAttributionRollup
from sandboxes.services.step_rollups import step_attributions_refresh
from sandboxes.services.trajectories import learner_steps_report, trajectories_report
from sandboxes.tests.api_support import make_job, make_user
from sandboxes.training_selectors import attribute_from_rows, critical_path, step_records

pytestmark = pytest.mark.django_db

T0 = 1_780_000_000.0
NOW = dt.datetime(2026, 12, 2, tzinfo=dt.UTC)


def _t(tid: str, slot: int, group: str, start: float, end: float, *kinds: tuple) -> dict:
    return {
        "id": tid,
        "slot": slot,
        "group": group,
        "start": T0 + start,
        "end": T0 + end,
        "failed": False,
        "phases": [{"kind": k, "start": T0 + a, "end": T0 + b} for k, a, b in kinds],
    }


A = _t("a", 0, "g1", 20, 150, ("rollout_acquisition", 20, 30), ("generation", 30, 150))
B = _t("b", 1, "g1", 40, 158, ("rollout_acquisition", 40, 45), ("generation", 45, 158))
# B's slot's previous occupant, reported late: it explains [10, 40] of step 1's wait.
C = _t("c", 1, "g0", 0, 35, ("generation", 0, 35))
# A trajectory that starts after step 1 ended, in a group step 1 did not admit.
D = _t("d", 2, "g9", 300, 400, ("generation", 300, 400))
STEP = {
    "step": 1,
    "wait_start": T0 + 10,
    "wait_end": T0 + 160,
    "train_end": T0 + 200,
    "groups": ["g1"],
}


def _seconds(job_id: int) -> dict[str, float]:
    path = critical_path(job_id)
    (step,) = path.attribution.per_step
    return dict(step.seconds)


def _raw(job_id: int) -> dict[str, float]:
    rows = step_records(LearnerStep.objects.filter(job_id=job_id))
    (step,) = attribute_from_rows(job_id, [s for _, s in rows]).per_step
    return dict(step.seconds)


def _report(job_id: int, *records: dict[str, Any]) -> None:
    trajectories_report(job_id=job_id, records=list(records), now=NOW)


def test_stored_attribution_equals_the_raw_one_and_a_late_trajectory_invalidates_it() -> None:
    user, _ = make_user("alice")
    job_id = make_job(user).pk
    _report(job_id, A, B)
    learner_steps_report(job_id=job_id, records=[STEP], now=NOW)
    before = _seconds(job_id)  # nothing stored yet: attributed from raw rows
    assert before["unresolved"] == pytest.approx(30.0)
    assert step_attributions_refresh(now=NOW) == 1
    assert step_attributions_refresh(now=NOW) == 0  # idempotent
    assert _seconds(job_id) == before == _raw(job_id)
    assert critical_path(job_id).attribution.shares == pytest.approx(
        {k: v / 190.0 for k, v in before.items()}
    )

    _report(job_id, D)  # starts after the step ended, another group: the row stays
    assert StepAttributionRollup.objects.filter(job_id=job_id).count() == 1

    _report(job_id, C)  # late, inside the step's wait: the stored row must go
    assert not StepAttributionRollup.objects.filter(job_id=job_id).exists()
    after = _seconds(job_id)
    assert after == _raw(job_id) != before
    assert after["unresolved"] == 0.0  # C covers [10, 35], its slot idle [35, 40]
    assert step_attributions_refresh(now=NOW) == 1
    assert _seconds(job_id) == after
    total = sum(after.values())
    assert total == pytest.approx(190.0, abs=1e-6)
