"""The demo's simulated learner: deterministic, valid wire records, the paper's shape."""

from __future__ import annotations

from sandboxes.critical_path import LearnerStep, Phase, Trajectory, attribute_steps
from sandboxes.learner_sim import LearnerShape, simulate

T0 = 1_780_000_000.0


def attributed(shape: LearnerShape):
    run = simulate(shape, start=T0)
    trajectories = [
        Trajectory(
            id=t["id"],
            slot=t["slot"],
            group=t["group"],
            start=t["start"],
            end=t["end"],
            failed=t["failed"],
            predecessor=t.get("predecessor"),
            phases=tuple(Phase(**p) for p in t["phases"]),
        )
        for t in run.trajectories
    ]
    steps = [
        LearnerStep(
            step=s["step"],
            wait_start=s["wait_start"],
            wait_end=s["wait_end"],
            handover_end=s["handover_end"],
            train_end=s["train_end"],
            groups=tuple(s["groups"]),
        )
        for s in run.steps
    ]
    return run, attribute_steps(steps, trajectories)


def test_the_same_shape_gives_the_same_records():
    assert simulate(LearnerShape(), start=T0) == simulate(LearnerShape(), start=T0)


def test_every_record_keeps_the_ingest_rules_and_failures_are_retried_in_their_slot():
    run = simulate(LearnerShape(steps=30, failure_rate=0.2), start=T0)
    by_id = {t["id"]: t for t in run.trajectories}
    for t in run.trajectories:
        assert t["start"] <= t["end"]
        for p in t["phases"]:
            assert t["start"] <= p["start"] <= p["end"] <= t["end"]
        if "predecessor" in t:
            before = by_id[t["predecessor"]]
            assert before["failed"] and before["slot"] == t["slot"]
            assert before["end"] <= t["start"]
    assert any(t["failed"] for t in run.trajectories)
    for s in run.steps:
        assert s["wait_start"] <= s["wait_end"] <= s["handover_end"] <= s["train_end"]
    assert [s["step"] for s in run.steps] == list(range(1, 31))


def test_the_demo_run_is_generation_bound_with_sandboxes_a_small_share_of_the_path():
    """Figure 5's shape: rollout acquisition almost never on the path, tests and grading are."""
    run, result = attributed(LearnerShape(steps=40))
    assert len(result.per_step) == 40
    for step in result.per_step:
        assert abs(sum(step.seconds.values()) - step.interval) <= 1e-6
    shares = result.shares
    assert shares["generation"] > 0.4
    assert shares["rollout_acquisition"] < 0.01
    assert shares["tests"] > shares["grading_acquisition"] > shares["rollout_acquisition"]
    assert shares["unresolved"] < 0.01
