"""A month of records with the paper's distributions, as rows for ``seeding.writer``.

Drawn from one seeded ``random.Random`` (the same arguments give the same month) and ending
at the caller's ``now`` (time is a parameter). The shapes are the paper's (issue 11 item 6):

* rollout sandbox lifetimes lognormal, p50 200 s and p99 450 s (σ = ln(450/200) / 2.326);
* 1.4 grading sandboxes per rollout (each rollout has one, 40% a second);
* create-to-Ready lognormal with p50 5 s; 4% of sandboxes see 1-4 address failures, each
  adding 8-20 s (the address-failure tail); 15% pull their image (+ a pull of ~20 s);
* creates spread uniformly over the month, plus one burst of 132 creates inside one second
  every hour;
* jobs of Zipf-like sizes (so per-job charts need top N + "others"), 80% on Kubernetes;
* trajectories and learner steps from ``sandboxes.learner_sim`` (fixed slots, groups, a step
  that waits for complete groups, failed attempts retried), one simulated run per training
  job, runs placed one after another across the month so the last ends near ``now``.

Sandboxes requested in the last ``LIVE_S`` seconds are still live (Ready or in use); older
ones were released and deleted.
"""

from __future__ import annotations

import datetime as dt
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from sandboxes.learner_sim import LearnerShape, simulate
from sandboxes.models import new_execd_key

MONTH_S = 30 * 86400
BURST = 132
BURST_EVERY_S = 3600
LIVE_S = 600
GRADING_PER_ROLLOUT = 1.4
LIFETIME_P50_S, LIFETIME_P99_S = 200.0, 450.0
LIFETIME_SIGMA = math.log(LIFETIME_P99_S / LIFETIME_P50_S) / 2.326
READY_P50_S = 5.0
NODES = 200
SLOTS, GROUP_SIZE, GROUPS_PER_STEP = 64, 8, 8


@dataclass(frozen=True)
class HistoryShape:
    sandboxes: int
    trajectories: int
    jobs: int = 60
    training_jobs: int = 12
    seed: int = 7


def _at(epoch_s: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(epoch_s, tz=dt.UTC)


def job_rows(shape: HistoryShape, *, first_id: int, owner_id: int, now: float) -> list[dict]:
    backends = job_backends(shape)
    return [
        {
            "id": first_id + i,
            "name": f"history-{i:03d}-{backends[i]}",
            "owner_id": owner_id,
            "state": "active",
            "created_at": _at(now - MONTH_S),
            "execd_key": new_execd_key(),
        }
        for i in range(shape.jobs)
    ]


def job_backends(shape: HistoryShape) -> list[str]:
    return ["kubernetes" if i % 5 else "local" for i in range(shape.jobs)]


def _request_times(rng: random.Random, n: int, now: float) -> Iterator[float]:
    """``n`` request times: hourly bursts of 132 within one second, the rest uniform."""
    start = now - MONTH_S
    bursts = min(n // (4 * BURST), MONTH_S // BURST_EVERY_S)
    for b in range(bursts):
        second = math.floor(start + (b + 1) * BURST_EVERY_S - 1800.0 + rng.uniform(0, 60))
        for _ in range(BURST):
            yield second + rng.random() * 0.999
    for _ in range(n - bursts * BURST):
        yield start + rng.random() * MONTH_S


def sandbox_and_acquisition_rows(
    shape: HistoryShape,
    *,
    first_sandbox_id: int,
    first_acquisition_id: int,
    first_job_id: int,
    now: float,
) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """One (sandbox row, acquisition row) per sandbox; see the module docstring."""
    rng = random.Random(shape.seed)
    weights = [1.0 / (i + 1) for i in range(shape.jobs)]  # Zipf-like job sizes
    backends = job_backends(shape)
    grading_share = GRADING_PER_ROLLOUT / (1 + GRADING_PER_ROLLOUT)
    updated = _at(now)
    jobs = rng.choices(range(shape.jobs), weights=weights, k=shape.sandboxes)
    for i, requested in enumerate(_request_times(rng, shape.sandboxes, now)):
        job = jobs[i]
        grading = rng.random() < grading_share
        failures = rng.randint(1, 4) if rng.random() < 0.04 else 0
        pulled = rng.random() < 0.15
        pull_s = 20.0 * rng.lognormvariate(0, 0.3) if pulled else 0.0
        ready_s = READY_P50_S * rng.lognormvariate(0, 0.35) + pull_s
        ready_s += sum(rng.uniform(8, 20) for _ in range(failures))
        if grading:
            lifetime = 30.0 * rng.lognormvariate(0, 0.4)
        else:
            lifetime = LIFETIME_P50_S * rng.lognormvariate(0, LIFETIME_SIGMA)
        warm = rng.random() < 0.15
        queue_s = rng.uniform(0, 1.5) if rng.random() < 0.2 else 0.0
        ready = requested + queue_s + ready_s
        acquired = ready + (rng.uniform(0, 30) if warm else 0.01)
        released = acquired + lifetime
        live = requested > now - LIVE_S
        sandbox_id = first_sandbox_id + i
        key = f"{job:03d}{'g' if grading else 'r'}{i % 3}".ljust(16, "0")
        node = rng.randrange(NODES)
        sandbox = {
            "id": sandbox_id,
            "job_id": first_job_id + job,
            "name": f"sm-hist-{sandbox_id}",
            "nonce": f"n{sandbox_id}",
            "token": f"t{sandbox_id}",
            "backend": backends[job],
            "role": "grading" if grading else "rollout",
            "state": ("in_use" if released > now else "released") if live else "deleted",
            "source": "warm" if warm else "created",
            "image": f"swe/task-{i % 500}",
            "cpu_millis": 1000,
            "memory_bytes": 2 << 30,
            "key_hash": key,
            "node": f"node-{node:03d}",
            "address": f"10.{node % 250}.{i % 250}.{(i // 250) % 250}:7000",
            "address_failures": failures,
            "image_present": not pulled,
            "pull_ms": pull_s * 1000 if pulled else None,
            "agent_used": True,
            "requested_at": _at(requested),
            "api_created_at": _at(requested + queue_s + 0.05),
            "scheduled_at": _at(requested + queue_s + 0.2),
            "address_assigned_at": _at(ready - 1.0),
            "image_pulled_at": _at(ready - 1.5) if pulled else None,
            "started_at": _at(ready - 0.8),
            "ready_at": _at(ready),
            "healthy_at": _at(ready + 0.01),
            "acquired_at": _at(acquired),
            "released_at": None if live and released > now else _at(released),
            "deleting_at": None if live else _at(released + 0.5),
            "deleted_at": None if live else _at(released + 2.5),
            "updated_at": updated,
        }
        started = ready - 0.01 if warm else requested
        acquisition = {
            "id": first_acquisition_id + i,
            "job_id": first_job_id + job,
            "sandbox_id": sandbox_id,
            "role": sandbox["role"],
            "image": sandbox["image"],
            "key_hash": key,
            "outcome": "ok",
            "source": sandbox["source"],
            "started_at": _at(started if not warm else acquired - 0.01),
            "finished_at": _at(acquired),
            "queue_ms": queue_s * 1000,
            "create_ms": None if warm else (ready - requested - queue_s) * 1000,
            "wait_ms": 10.0 if warm else (acquired - requested) * 1000,
        }
        yield sandbox, acquisition


@dataclass
class TrainingRows:
    trajectories: list[dict[str, Any]]
    phases: list[dict[str, Any]]
    steps: list[dict[str, Any]]


def training_rows(
    shape: HistoryShape,
    *,
    first_job_id: int,
    first_trajectory_id: int,
    first_phase_id: int,
    first_step_id: int,
    now: float,
) -> TrainingRows:
    """Simulated learner runs of the first ``training_jobs`` jobs, back to back to ``now``."""
    jobs = max(1, min(shape.training_jobs, shape.jobs))
    per_job = max(1, shape.trajectories // jobs)
    steps = max(1, round(per_job / (GROUP_SIZE * GROUPS_PER_STEP) / 1.05))
    received = _at(now)
    runs = []
    for j in range(jobs):
        run = simulate(
            LearnerShape(
                slots=SLOTS,
                group_size=GROUP_SIZE,
                groups_per_step=GROUPS_PER_STEP,
                steps=steps,
                failure_rate=0.05,
                train_s=60.0,
                handover_s=2.0,
                seed=shape.seed * 1000 + j,
            ),
            start=0.0,
        )
        runs.append(run)
    # Each job's run starts where the month would place it, so the last ends at ``now``.
    span = MONTH_S / jobs
    out = TrainingRows([], [], [])
    tid, pid, sid = first_trajectory_id, first_phase_id, first_step_id
    for j, run in enumerate(runs):
        offset = now - MONTH_S + (j + 1) * span - run.end - 1.0
        for record in run.trajectories:
            out.trajectories.append(
                {
                    "id": tid,
                    "job_id": first_job_id + j,
                    "trainer_id": record["id"],
                    "slot": record["slot"],
                    "group": record["group"],
                    "start": record["start"] + offset,
                    "end": record["end"] + offset,
                    "failed": record["failed"],
                    "predecessor": record.get("predecessor", ""),
                    "sandbox_ids": [],
                    "received_at": received,
                }
            )
            for phase in record["phases"]:
                out.phases.append(
                    {
                        "id": pid,
                        "trajectory_id": tid,
                        "kind": phase["kind"],
                        "start": phase["start"] + offset,
                        "end": phase["end"] + offset,
                        "from_sandman": False,
                    }
                )
                pid += 1
            tid += 1
        for step in run.steps:
            out.steps.append(
                {
                    "id": sid,
                    "job_id": first_job_id + j,
                    "step": step["step"],
                    "wait_start": step["wait_start"] + offset,
                    "wait_end": step["wait_end"] + offset,
                    "handover_end": step["handover_end"] + offset,
                    "train_end": step["train_end"] + offset,
                    "groups": step["groups"],
                    "dropped_groups": [],
                    "received_at": received,
                }
            )
            sid += 1
    return out
