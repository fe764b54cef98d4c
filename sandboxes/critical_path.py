"""Where each learner step's time went on the critical path (the paper's Appendix J, Figure 5).

The trainer keeps a fixed number of trajectories in flight, in numbered slots; a learner step
waits for complete groups, hands the batch over and trains. Each step interval
``[wait_start, train_end]`` is split into categories (:data:`CATEGORIES`) as Appendix J
("Decomposition") describes:

* ``[wait_end, train_end]`` (hand-over and training) is ``learner``.
* The wait window ``[wait_start, wait_end]`` is attributed to the phases of the trajectory whose
  completion ended it: the slowest member (latest end) of the last group admitted. "Last
  admitted" means last to complete, not last in the record's list, so groups listed out of
  order change nothing. Groups the variance filter dropped were admitted too and count.
* If that trajectory started inside the window, the earlier part goes to its failed
  predecessor (the attempt it retried) or, without one, to the trajectory whose end freed the
  slot it took (the previous occupant of its slot), recursively.
* Inside a trajectory, time no phase covers is ``other``; every second of a failed attempt is
  ``failure_retry``; time between a trajectory's end and the point it was traced from (a slot
  left idle, a group complete before admission) is ``other``; what cannot be traced (no member
  known, no predecessor, no earlier occupant, a cycle in the records) is ``unresolved``.

Invariants a reader must not break:

* Components of a step add up to its interval ``train_end - wait_start`` exactly up to float
  rounding (the tests check 1e-6 s; the paper's records met 0.003 s). Every rule above hands
  out disjoint pieces of the interval; a new rule must do the same, never estimate.
* Overlapping phases of one trajectory are resolved by start order (the earlier phase keeps
  the overlap) so no second is counted twice.
* No Django imports, no clock, no I/O: plain dataclasses in, plain dataclasses out. The REST
  route and the dashboards read records from the database and call :func:`attribute_steps`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

PHASE_KINDS: tuple[str, ...] = (
    "rollout_acquisition",
    "generation",
    "commands",
    "capture",
    "grading_acquisition",
    "tests",
    "release",
)
"""Phase kinds of the trainer's wire format (issue 11, item 1)."""

CATEGORIES: tuple[str, ...] = (
    "rollout_acquisition",
    "grading_acquisition",
    "tests",
    "failure_retry",
    "generation",
    "commands",
    "capture",
    "release",
    "other",
    "learner",
    "unresolved",
)
"""Every category a second of step time can land in; Figure 5's legend plus the paper's rest."""

SANDBOX_WAITING: tuple[str, ...] = ("rollout_acquisition", "grading_acquisition", "failure_retry")
"""Appendix J's "sandbox waiting": acquisition plus failure and retry (tests reported apart)."""

_EPS = 1e-9


@dataclass(frozen=True)
class Phase:
    """One phase of a trajectory, ``kind`` one of :data:`PHASE_KINDS`; epoch seconds."""

    kind: str
    start: float
    end: float


@dataclass(frozen=True)
class Trajectory:
    """One attempt at a rollout, as the trainer reports it (times in epoch seconds)."""

    id: str
    slot: int
    group: str
    start: float
    end: float
    failed: bool = False
    predecessor: str | None = None
    phases: tuple[Phase, ...] = ()


@dataclass(frozen=True)
class LearnerStep:
    """One learner step: it waited ``[wait_start, wait_end]``, then handed over and trained."""

    step: int
    wait_start: float
    wait_end: float
    train_end: float
    groups: tuple[str, ...]
    handover_end: float | None = None
    dropped_groups: tuple[str, ...] = ()

    @property
    def interval(self) -> float:
        return self.train_end - self.wait_start


@dataclass(frozen=True)
class StepAttribution:
    """Seconds per category for one step; ``ended_by`` is the trajectory that ended its wait."""

    step: int
    start: float
    end: float
    seconds: Mapping[str, float]
    ended_by: str | None

    @property
    def interval(self) -> float:
        return self.end - self.start

    def shares(self) -> dict[str, float]:
        """Each category's fraction of this step's interval (all zero for an empty interval)."""
        return _fractions(self.seconds, self.interval)


@dataclass(frozen=True)
class Attribution:
    """Per-step results and the shares of their summed intervals."""

    per_step: tuple[StepAttribution, ...]
    shares: Mapping[str, float] = field(default_factory=dict)

    @property
    def unresolved_share(self) -> float:
        return self.shares.get("unresolved", 0.0)


class _Ledger:
    """Seconds per category; adds only non-empty pieces so zero-width rules stay invisible."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = dict.fromkeys(CATEGORIES, 0.0)

    def add(self, category: str, lo: float, hi: float) -> None:
        if hi > lo:
            self.seconds[category] += hi - lo


class Timeline:
    """Trajectories indexed by id, group and slot: the lookups the attribution walks through."""

    def __init__(self, trajectories: Iterable[Trajectory]) -> None:
        self.by_id: dict[str, Trajectory] = {}
        self.by_group: dict[str, list[Trajectory]] = {}
        self.by_slot: dict[int, list[Trajectory]] = {}
        for t in trajectories:
            self.by_id[t.id] = t
            self.by_group.setdefault(t.group, []).append(t)
            self.by_slot.setdefault(t.slot, []).append(t)
        for occupants in self.by_slot.values():
            occupants.sort(key=lambda t: (t.end, t.start, t.id))

    def ending_trajectory(self, step: LearnerStep) -> Trajectory | None:
        """The slowest complete member of the last group to complete, or None if none is known.

        Failed attempts are not members: their retries are. Among groups the one whose
        slowest member ended last is the last admitted, whatever order the record lists them.
        """
        best: Trajectory | None = None
        for group in (*step.groups, *step.dropped_groups):
            for t in self.by_group.get(group, ()):
                if t.failed:
                    continue
                if best is None or (t.end, t.start, t.id) > (best.end, best.start, best.id):
                    best = t
        return best

    def previous_occupant(self, t: Trajectory) -> Trajectory | None:
        """The trajectory whose end freed ``t``'s slot: latest end at or before ``t.start``."""
        found: Trajectory | None = None
        for other in self.by_slot.get(t.slot, ()):
            if other.id == t.id:
                continue
            if other.end <= t.start + _EPS:
                found = other
            else:
                break
        return found

    def traced_from(self, t: Trajectory) -> Trajectory | None:
        """What explains the time before ``t`` started: its failed predecessor, else its slot."""
        if t.predecessor is not None:
            pred = self.by_id.get(t.predecessor)
            if pred is not None:
                return pred
        return self.previous_occupant(t)


def _phases(ledger: _Ledger, t: Trajectory, lo: float, hi: float) -> None:
    """Split ``[lo, hi]`` (inside ``t``) over ``t``'s phases; uncovered time is ``other``."""
    if t.failed:
        ledger.add("failure_retry", lo, hi)
        return
    cursor = lo
    for phase in sorted(t.phases, key=lambda p: (p.start, p.end)):
        start = max(phase.start, cursor)
        end = min(phase.end, hi)
        if end <= start:
            continue
        ledger.add("other", cursor, start)
        ledger.add(phase.kind if phase.kind in PHASE_KINDS else "other", start, end)
        cursor = end
    ledger.add("other", cursor, hi)


def _window(
    ledger: _Ledger, timeline: Timeline, first: Trajectory | None, lo: float, hi: float
) -> None:
    """Attribute the window ``[lo, hi]`` walking back from ``first``, latest time first."""
    seen: set[str] = set()
    t = first
    while hi > lo:
        if t is None or t.id in seen:
            ledger.add("unresolved", lo, hi)
            return
        seen.add(t.id)
        # After t ended and before the point we traced from: the slot or the group sat idle.
        ledger.add("other", max(lo, t.end), hi)
        hi = min(hi, t.end)
        inside = max(lo, t.start)
        _phases(ledger, t, inside, hi)
        hi = min(hi, inside)
        t = timeline.traced_from(t)


def attribute_step(step: LearnerStep, timeline: Timeline) -> StepAttribution:
    """Split one step interval into :data:`CATEGORIES` (Appendix J's decomposition)."""
    ledger = _Ledger()
    wait_end = min(max(step.wait_end, step.wait_start), step.train_end)
    ledger.add("learner", wait_end, step.train_end)
    first = timeline.ending_trajectory(step)
    _window(ledger, timeline, first, step.wait_start, wait_end)
    return StepAttribution(
        step=step.step,
        start=step.wait_start,
        end=step.train_end,
        seconds=ledger.seconds,
        ended_by=first.id if first is not None and wait_end > step.wait_start else None,
    )


def attribute_steps(
    steps: Sequence[LearnerStep], trajectories: Iterable[Trajectory]
) -> Attribution:
    """Attribute every step and the shares of their summed intervals (Figure 5's bars)."""
    timeline = Timeline(trajectories)
    return combine(attribute_step(s, timeline) for s in steps)


def combine(results: Iterable[StepAttribution]) -> Attribution:
    """Per-step results (computed now or stored earlier) as one Attribution, by step number.

    The shares are the summed seconds over the summed intervals, so a step's stored result
    and a fresh one combine to the same answer as attributing all steps at once."""
    per_step = tuple(sorted(results, key=lambda r: r.step))
    totals = dict.fromkeys(CATEGORIES, 0.0)
    for result in per_step:
        for category, seconds in result.seconds.items():
            totals[category] += seconds
    interval = sum(result.interval for result in per_step)
    return Attribution(per_step=per_step, shares=_fractions(totals, interval))


def _fractions(seconds: Mapping[str, float], total: float) -> dict[str, float]:
    if total <= 0:
        return dict.fromkeys(CATEGORIES, 0.0)
    return {category: seconds.get(category, 0.0) / total for category in CATEGORIES}


LITTLE_CAVEAT = (
    "An estimate from a fixed-concurrency accounting model (Appendix J), not a measurement: "
    "it assumes the run stays generation-bound and generation does not slow down when "
    "sandbox time is removed; with shorter sandbox phases other trajectories would finish "
    "first and other groups would enter training."
)


@dataclass(frozen=True)
class FixedConcurrencyEstimate:
    """Little's law beside the measured step interval, and the step reduction f (Appendix J).

    ``estimated_interval_s`` = trajectories per step × mean trajectory time ÷ mean
    trajectories in flight; ``f`` = (acquisition + failed attempts' slot time) ÷ trajectory
    time, and removing it shortens a step by about ``f`` (``estimated_reduction``).
    """

    trajectories_per_step: float
    mean_trajectory_s: float
    mean_in_flight: float
    estimated_interval_s: float
    measured_interval_s: float
    f: float
    caveat: str = LITTLE_CAVEAT

    @property
    def estimated_reduction(self) -> float:
        return self.f


def fixed_concurrency_estimate(
    *,
    steps: int,
    trajectories_consumed: int,
    trajectory_seconds: float,
    in_flight_seconds: float,
    span_seconds: float,
    measured_interval_s: float,
    sandbox_seconds: float,
) -> FixedConcurrencyEstimate | None:
    """The estimate from sums the database computed; None when a denominator is empty.

    ``trajectory_seconds`` is the slot time of the consumed trajectories and their failed
    attempts; ``in_flight_seconds`` the slot time of every attempt inside the span, so
    ``in_flight_seconds / span_seconds`` is the mean number in flight.
    """
    if steps <= 0 or trajectories_consumed <= 0 or span_seconds <= 0 or in_flight_seconds <= 0:
        return None
    if trajectory_seconds <= 0:
        return None
    per_step = trajectories_consumed / steps
    mean_trajectory = trajectory_seconds / trajectories_consumed
    in_flight = in_flight_seconds / span_seconds
    return FixedConcurrencyEstimate(
        trajectories_per_step=per_step,
        mean_trajectory_s=mean_trajectory,
        mean_in_flight=in_flight,
        estimated_interval_s=per_step * mean_trajectory / in_flight,
        measured_interval_s=measured_interval_s,
        f=min(max(sandbox_seconds / trajectory_seconds, 0.0), 1.0),
    )
