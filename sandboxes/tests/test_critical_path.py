"""Critical-path attribution (Appendix J) on hand-built timelines: pure logic, no Django.

Every test checks that the components add up to each step interval within 1e-6 s, the
paper's invariant (Appendix J reports 0.003 s on its records).
"""

from __future__ import annotations

import random

import pytest

from sandboxes.critical_path import (
    CATEGORIES,
    PHASE_KINDS,
    LearnerStep,
    Phase,
    StepAttribution,
    Trajectory,
    attribute_steps,
)


def traj(
    id: str,
    start: float,
    end: float,
    *,
    slot: int = 0,
    group: str = "g",
    failed: bool = False,
    predecessor: str | None = None,
    phases: tuple[tuple[str, float, float], ...] = (),
) -> Trajectory:
    return Trajectory(
        id=id,
        slot=slot,
        group=group,
        start=start,
        end=end,
        failed=failed,
        predecessor=predecessor,
        phases=tuple(Phase(kind, a, b) for kind, a, b in phases),
    )


def step(
    wait_start: float,
    wait_end: float,
    train_end: float,
    groups: tuple[str, ...] = ("g",),
    *,
    n: int = 1,
    dropped: tuple[str, ...] = (),
) -> LearnerStep:
    return LearnerStep(
        step=n,
        wait_start=wait_start,
        wait_end=wait_end,
        train_end=train_end,
        groups=groups,
        dropped_groups=dropped,
    )


def only(result: StepAttribution) -> dict[str, float]:
    """The non-zero categories of one step, rounded for exact comparison."""
    return {k: round(v, 9) for k, v in result.seconds.items() if abs(v) > 1e-12}


def assert_adds_up(result: StepAttribution) -> None:
    assert set(result.seconds) == set(CATEGORIES)
    assert all(v >= 0 for v in result.seconds.values())
    assert abs(sum(result.seconds.values()) - result.interval) <= 1e-6


def one(s: LearnerStep, *trajectories: Trajectory) -> StepAttribution:
    (result,) = attribute_steps([s], trajectories).per_step
    assert_adds_up(result)
    return result


# The hand-computable example of the closing note: one group, the slowest member's
# phases cover the wait except a 2 s gap inside it and 2 s between its end and admission.
B_PHASES = (
    ("rollout_acquisition", 40, 45),
    ("generation", 45, 130),
    ("commands", 130, 140),
    ("grading_acquisition", 142, 148),
    ("tests", 148, 156),
    ("release", 156, 158),
)


def test_the_wait_goes_to_the_phases_of_the_slowest_member_and_the_rest_to_the_learner():
    a = traj("a", 20, 150, slot=0)
    b = traj("b", 40, 158, slot=1, phases=B_PHASES)
    result = one(step(100, 160, 200), a, b)
    assert result.ended_by == "b"
    assert only(result) == {
        "generation": 30,
        "commands": 10,
        "other": 4,  # 140-142 inside b, uncovered; 158-160 between b's end and admission
        "grading_acquisition": 6,
        "tests": 8,
        "release": 2,
        "learner": 40,
    }
    shares = attribute_steps([step(100, 160, 200)], [a, b]).shares
    assert shares["learner"] == pytest.approx(0.40)
    assert shares["generation"] == pytest.approx(0.30)
    assert shares["grading_acquisition"] == pytest.approx(0.06)
    assert shares["rollout_acquisition"] == 0.0  # overlapped by the wait's start: off the path


def test_a_step_that_did_not_wait_at_all_is_all_learner():
    b = traj("b", 40, 90, phases=(("generation", 40, 90),))
    result = one(step(100, 100, 130), b)
    assert only(result) == {"learner": 30}
    assert result.ended_by is None


def test_a_group_complete_before_the_wait_opened_leaves_only_admission_time_as_other():
    b = traj("b", 40, 90, phases=(("generation", 40, 90),))
    assert only(one(step(100, 103, 130), b)) == {"other": 3, "learner": 27}


def test_recursion_through_two_failed_predecessors_charges_their_time_to_failure_retry():
    # c retried b, which retried a; c's own slot has a decoy that must not be followed.
    a = traj("a", 90, 125, slot=1, group="g", failed=True)
    b = traj("b", 130, 165, slot=1, group="g", failed=True, predecessor="a")
    decoy = traj("decoy", 50, 169, slot=0, group="other", phases=(("generation", 50, 169),))
    c = traj("c", 170, 195, slot=0, predecessor="b", phases=(("tests", 170, 195),))
    result = one(step(100, 200, 250), a, b, decoy, c)
    assert result.ended_by == "c"
    assert only(result) == {
        "other": 15,  # 195-200, 165-170, 125-130: gaps before each retry and admission
        "tests": 25,
        "failure_retry": 60,  # b 130-165, a 100-125
        "learner": 50,
    }


def test_a_slot_whose_previous_occupant_failed_charges_failure_retry():
    p = traj("p", 110, 148, slot=3, group="lost", failed=True)
    t = traj("t", 150, 190, slot=3, phases=(("generation", 150, 180), ("tests", 180, 190)))
    assert only(one(step(120, 190, 200), p, t)) == {
        "generation": 30,
        "tests": 10,
        "other": 2,
        "failure_retry": 28,
        "learner": 10,
    }


def test_the_slot_walk_goes_back_through_the_failed_occupant_to_the_one_before():
    q = traj("q", 60, 105, slot=3, group="old", phases=(("generation", 60, 105),))
    p = traj("p", 110, 148, slot=3, group="lost", failed=True)
    t = traj("t", 150, 190, slot=3, phases=(("generation", 150, 190),))
    assert only(one(step(100, 190, 200), q, p, t)) == {
        "generation": 45,  # t 150-190 and q 100-105
        "other": 7,  # 148-150 and 105-110: the slot sat idle
        "failure_retry": 38,
        "learner": 10,
    }


def test_a_window_wider_than_every_member_is_unresolved_before_anything_known_started():
    a = traj("a", 30, 90, slot=0, phases=(("generation", 30, 90),))
    b = traj("b", 50, 95, slot=1, phases=(("generation", 50, 80), ("tests", 80, 95)))
    assert only(one(step(0, 100, 120), a, b)) == {
        "generation": 30,
        "tests": 15,
        "other": 5,
        "unresolved": 50,
        "learner": 20,
    }


def test_a_window_wider_than_every_member_is_traced_through_the_slot_as_far_as_records_go():
    before = traj("before", 10, 40, slot=1, group="old", phases=(("commands", 10, 40),))
    b = traj("b", 50, 95, slot=1, phases=(("generation", 50, 95),))
    result = one(step(0, 100, 120), before, b)
    assert only(result) == {
        "generation": 45,
        "other": 15,  # 95-100 and the idle slot 40-50
        "commands": 30,
        "unresolved": 10,
        "learner": 20,
    }
    assert attribute_steps([step(0, 100, 120)], [before, b]).unresolved_share == pytest.approx(
        10 / 120
    )


def test_groups_admitted_out_of_order_are_ranked_by_completion_not_by_list_order():
    late = traj("late", 60, 140, slot=0, group="g1", phases=(("tests", 60, 140),))
    early = traj("early", 50, 120, slot=1, group="g2", phases=(("generation", 50, 120),))
    results = [one(step(100, 140, 150, groups), late, early) for groups in (("g2", "g1"),)]
    results.append(one(step(100, 140, 150, ("g1", "g2")), early, late))
    for result in results:
        assert result.ended_by == "late"
        assert only(result) == {"tests": 40, "learner": 10}


def test_a_dropped_group_that_completed_last_ended_the_wait():
    kept = traj("kept", 50, 120, slot=0, group="kept", phases=(("generation", 50, 120),))
    dropped = traj("dropped", 60, 130, slot=1, group="zero-var", phases=(("tests", 60, 130),))
    result = one(step(100, 130, 140, ("kept",), dropped=("zero-var",)), kept, dropped)
    assert result.ended_by == "dropped"
    assert only(result) == {"tests": 30, "learner": 10}


def test_a_failed_attempt_is_not_the_member_that_ended_the_wait_its_retry_is():
    first = traj("first", 50, 135, slot=0, failed=True)
    retry = traj("retry", 60, 125, slot=1, predecessor="first", phases=(("tests", 60, 125),))
    result = one(step(100, 130, 140), first, retry)
    assert result.ended_by == "retry"
    assert only(result) == {"tests": 25, "other": 5, "learner": 10}


def test_overlapping_phases_are_counted_once_with_the_earlier_phase_keeping_the_overlap():
    t = traj("t", 0, 100, phases=(("generation", 0, 60), ("commands", 40, 90)))
    assert only(one(step(0, 100, 100), t)) == {"generation": 60, "commands": 30, "other": 10}


def test_an_unknown_group_leaves_the_whole_wait_unresolved():
    t = traj("t", 0, 100, group="elsewhere")
    result = one(step(10, 50, 60), t)
    assert only(result) == {"unresolved": 40, "learner": 10}
    assert result.ended_by is None


def test_a_cycle_in_the_records_ends_as_unresolved_instead_of_looping():
    x = traj("x", 50, 60, slot=0, group="x", failed=True, predecessor="y")
    y = traj("y", 50, 60, slot=1, group="y", failed=True, predecessor="x")
    t = traj("t", 60, 80, slot=2, predecessor="x", phases=(("tests", 60, 80),))
    assert only(one(step(0, 80, 90), x, y, t)) == {
        "tests": 20,
        "failure_retry": 10,
        "unresolved": 50,
        "learner": 10,
    }


def test_shares_are_of_the_summed_step_intervals():
    b = traj("b", 0, 100, phases=(("tests", 0, 100),))
    steps = [step(50, 100, 150, n=1), step(150, 150, 160, n=2)]
    result = attribute_steps(steps, [b])
    assert [s.step for s in result.per_step] == [1, 2]
    assert result.shares["tests"] == pytest.approx(50 / 110)
    assert result.shares["learner"] == pytest.approx(60 / 110)
    assert sum(result.shares.values()) == pytest.approx(1.0)
    assert attribute_steps([], [b]).shares == dict.fromkeys(CATEGORIES, 0.0)


def test_components_add_up_to_every_step_interval_on_a_simulated_run():
    """Fixed slots, groups, failures retried in the same slot: 200 steps, within 1e-6 s."""
    rng = random.Random(11)
    slots, per_group = 8, 4
    clock = [1.7e9] * slots  # epoch-sized times so float rounding is as in production
    trajectories: list[Trajectory] = []
    groups: list[tuple[str, float]] = []
    for g in range(200):
        ends = []
        for m in range(per_group):
            slot = min(range(slots), key=lambda s: clock[s])
            start = clock[slot] + rng.uniform(0, 0.5)
            pred = None
            if rng.random() < 0.1:
                fail_end = start + rng.uniform(1, 30)
                failed_id = f"g{g}m{m}f"
                trajectories.append(traj(failed_id, start, fail_end, slot=slot, failed=True))
                pred, start = failed_id, fail_end + rng.uniform(0, 0.3)
            cursor, phases = start, []
            for kind in PHASE_KINDS:
                length = rng.uniform(0, 20)
                gap = rng.uniform(0, 0.2)
                phases.append((kind, cursor + gap, cursor + gap + length))
                cursor += gap + length
            end = cursor + rng.uniform(0, 0.1)
            trajectories.append(
                traj(
                    f"g{g}m{m}",
                    start,
                    end,
                    slot=slot,
                    group=f"g{g}",
                    predecessor=pred,
                    phases=tuple(phases),
                )
            )
            clock[slot] = end
            ends.append(end)
        groups.append((f"g{g}", max(ends)))
    steps, t = [], 1.7e9 + 30
    for n in range(0, 200, 2):
        done = max(groups[n][1], groups[n + 1][1])
        wait_end = max(t, done) + rng.uniform(0, 0.05)
        train_end = wait_end + rng.uniform(1, 10)
        steps.append(step(t, wait_end, train_end, (groups[n + 1][0], groups[n][0]), n=n // 2))
        t = train_end
    result = attribute_steps(steps, trajectories)
    assert len(result.per_step) == 100
    for per_step in result.per_step:
        assert_adds_up(per_step)
    assert sum(result.shares.values()) == pytest.approx(1.0)
    assert result.shares["failure_retry"] > 0
    assert result.shares["tests"] > 0


def test_the_attribution_and_the_demo_learner_import_no_django():
    import subprocess
    import sys

    code = (
        "import sys, sandboxes.critical_path, sandboxes.learner_sim; "
        "sys.exit(any(m.split('.')[0] == 'django' for m in sys.modules))"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
