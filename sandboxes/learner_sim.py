"""A simulated learner for ``demo_trainer``: trajectories and steps in the trainer's wire format.

The shape is the paper's (§5.4, Appendix J): a fixed number of in-flight slots, each running
one trajectory after another; trajectories belong to groups; a step waits for the next
complete groups in completion order, hands the batch over and trains; a failed attempt is
retried at once in the same slot with ``predecessor`` naming it. Phase lengths are drawn
from a seeded generator around the paper's orders of magnitude (rollouts of minutes,
create-to-Ready of seconds), scaled by ``scale`` so a demo can stay short.

Invariants a reader must not break:

* Pure and deterministic: no Django, no clock, no I/O; the same arguments give the same
  records, so a test can check the demo's shares exactly.
* Every record passes the ingest rules (phases inside their trajectory, end after start,
  wait_start <= wait_end <= handover_end <= train_end).
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field
from typing import Any

# (kind, median seconds); lognormal spread per phase. Generation dominates, as in the paper.
_PHASES: tuple[tuple[str, float], ...] = (
    ("rollout_acquisition", 5.0),
    ("generation", 150.0),
    ("commands", 25.0),
    ("capture", 1.0),
    ("grading_acquisition", 6.0),
    ("tests", 20.0),
    ("release", 0.5),
)


@dataclass(frozen=True)
class LearnerShape:
    """The simulated run: slots, group size, groups per step, failure rate, learner time."""

    slots: int = 8
    group_size: int = 4
    groups_per_step: int = 2
    steps: int = 12
    failure_rate: float = 0.05
    train_s: float = 30.0
    handover_s: float = 1.0
    scale: float = 1.0
    seed: int = 11


@dataclass
class SimulatedRun:
    """What the simulation produced, ready for ``report_trajectories`` / ``report_steps``."""

    trajectories: list[dict[str, Any]] = field(default_factory=list)
    steps: list[dict[str, Any]] = field(default_factory=list)

    @property
    def end(self) -> float:
        return max((s["train_end"] for s in self.steps), default=0.0)


def _attempt(
    rng: random.Random, shape: LearnerShape, start: float
) -> tuple[list[dict[str, Any]], float, bool]:
    """Phases of one attempt from ``start``; a failed one stops partway through."""
    failed = rng.random() < shape.failure_rate
    stop_at = rng.randrange(len(_PHASES)) if failed else len(_PHASES)
    phases, cursor = [], start
    for i, (kind, median) in enumerate(_PHASES):
        if i > stop_at:
            break
        length = median * shape.scale * rng.lognormvariate(0.0, 0.35)
        if i == stop_at:  # the failing phase runs part way
            length *= rng.uniform(0.2, 1.0)
        gap = rng.uniform(0.0, 0.3) * shape.scale
        phase_start = cursor + gap
        cursor = phase_start + length  # the trajectory ends exactly where its last phase does
        phases.append({"kind": kind, "start": phase_start, "end": cursor})
    return phases, cursor, failed


def simulate(shape: LearnerShape, *, start: float) -> SimulatedRun:
    """Run the slots and the learner from epoch second ``start``; see the module docstring."""
    rng = random.Random(shape.seed)
    run = SimulatedRun()
    groups_needed = shape.steps * shape.groups_per_step + shape.slots // shape.group_size + 1
    members = groups_needed * shape.group_size
    free = [(start, slot) for slot in range(shape.slots)]
    heapq.heapify(free)
    done: dict[str, float] = {}
    for member in range(members):
        at, slot = heapq.heappop(free)
        group = f"g{member // shape.group_size}"
        predecessor = None
        attempt = 0
        while True:
            tid = f"{group}-m{member % shape.group_size}-a{attempt}"
            phases, end, failed = _attempt(rng, shape, at)
            record: dict[str, Any] = {
                "id": tid,
                "slot": slot,
                "group": group,
                "start": at,
                "end": end,
                "failed": failed,
                "phases": phases,
            }
            if predecessor is not None:
                record["predecessor"] = predecessor
            run.trajectories.append(record)
            at = end + rng.uniform(0.0, 0.2) * shape.scale
            if not failed:
                break
            predecessor, attempt = tid, attempt + 1
        done[group] = max(done.get(group, 0.0), end)
        heapq.heappush(free, (at, slot))
    _learn(run, shape, done, rng, start)
    return run


def _learn(
    run: SimulatedRun,
    shape: LearnerShape,
    done: dict[str, float],
    rng: random.Random,
    start: float,
) -> None:
    """Steps take the next complete groups in completion order; listed in sampling order."""
    by_completion = sorted(done, key=lambda g: (done[g], g))
    t = start + 1.0
    for n in range(shape.steps):
        batch = by_completion[n * shape.groups_per_step : (n + 1) * shape.groups_per_step]
        ready = max(done[g] for g in batch)
        wait_end = max(t, ready) + rng.uniform(0.0, 0.05)
        handover_end = wait_end + shape.handover_s * shape.scale
        train_end = handover_end + shape.train_s * shape.scale * rng.lognormvariate(0.0, 0.2)
        run.steps.append(
            {
                "step": n + 1,
                "wait_start": t,
                "wait_end": wait_end,
                "handover_end": handover_end,
                "train_end": train_end,
                "groups": sorted(batch, key=lambda g: int(g[1:])),
            }
        )
        t = train_end
