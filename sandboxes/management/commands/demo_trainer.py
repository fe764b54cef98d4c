"""``manage.py demo_trainer``: simulated rollouts through the Python client, over HTTP.

Each rollout does what a trainer's agent worker does (docs/architecture.md §2): acquire a
sandbox, run a few commands in its persistent shell, write a file, read it back and check
its sha256 against what execd reported for the write, then release with a verdict. C
worker threads share N rollouts. It talks to the service only through
``sandboxes.client`` (HTTP), so it works against ``runserver``/Daphne as well as a
test's live server. Without ``--token`` it makes (or reuses) the user ``demo-trainer``
and its DRF token in THIS process's database, which must be the server's.

The job it registers is drained at the end unless ``--keep-job``, so a loop of demo
runs does not pile up warm pods. With ``--learner-steps N`` it also simulates a learner
(``sandboxes.learner_sim``: fixed slots, groups, retried failures), reports its
trajectories and steps, ending now, and prints the critical-path shares Sandman computed.
With ``--grade-samples`` it also grades the shipped sample task set (``sample_tasks/``,
imported and built by ``manage.py sample_tasks --import``): each task's reference patch and
the normal task's empty patch, through ``grade()``/``wait()``, and prints the verdicts.
"""

from __future__ import annotations

import hashlib
import statistics
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from grading import samples
from sandboxes.client import Client, Job, SandmanClientError
from sandboxes.learner_sim import LearnerShape, simulate

DEMO_USER = "demo-trainer"


@dataclass
class RolloutResult:
    ok: bool
    source: str = ""
    wait_ms: float = 0.0
    total_ms: float = 0.0
    error: str = ""


def demo_token() -> str:
    """The demo user's DRF token in the local database (created on first use)."""
    from django.contrib.auth import get_user_model
    from rest_framework.authtoken.models import Token

    user, _ = get_user_model().objects.get_or_create(username=DEMO_USER)
    token, _ = Token.objects.get_or_create(user=user)
    return token.key


def one_rollout(job: Job, *, index: int, image: str, spec: dict[str, Any]) -> RolloutResult:
    started = time.monotonic()
    try:
        with job.acquire(image=image, spec=spec, role="rollout", timeout_s=120) as sandbox:
            first = sandbox.run("echo rollout-$((6*7)) && pwd")
            if first.exit_code != 0 or "rollout-42" not in first.output:
                raise RuntimeError(f"echo gave exit {first.exit_code}: {first.output!r}")
            sandbox.run("export DEMO_STEP=2; mkdir -p work && cd work")
            second = sandbox.run('echo "$DEMO_STEP:$(basename "$PWD")"')
            if second.output.strip() != "2:work":  # the shell kept its env and cwd
                raise RuntimeError(f"shell state lost: {second.output!r}")
            content = f"rollout {index}\nuuid {uuid.uuid4()}\n"
            written = sandbox.write("work/answer.txt", content)
            expected = hashlib.sha256(content.encode()).hexdigest()
            back = sandbox.read("work/answer.txt")
            raw = sandbox.read_bytes("work/answer.txt")
            if not (
                written.sha256 == back.sha256 == expected == hashlib.sha256(raw.data).hexdigest()
            ):
                raise RuntimeError("sha256 of the file read back does not match the write")
            if back.content != content:
                raise RuntimeError("the file read back differs from what was written")
            sandbox.verdict = "pass"
            source, wait_ms = sandbox.source, sandbox.wait_ms
        return RolloutResult(
            ok=True,
            source=source,
            wait_ms=wait_ms,
            total_ms=(time.monotonic() - started) * 1000,
        )
    except (SandmanClientError, RuntimeError, KeyError) as exc:
        return RolloutResult(ok=False, error=f"{type(exc).__name__}: {exc}")


def wait_for_warm(job: Job, *, count: int, deadline_s: float) -> int:
    """Poll the job's warm count until ``count`` or the deadline; returns what it saw."""
    end = time.monotonic() + deadline_s
    warm = 0
    while time.monotonic() < end:
        warm = job.refresh().counts.get("warm", 0)
        if warm >= count:
            break
        time.sleep(0.2)  # a poll interval against a remote service, not a test sync
    return warm


def _pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


class Command(BaseCommand):
    help = "Run N simulated rollouts with C concurrent workers against Sandman over HTTP."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--rollouts", type=int, default=8)
        parser.add_argument("--concurrency", type=int, default=4)
        parser.add_argument("--url", default="http://127.0.0.1:8000")
        parser.add_argument("--token", default="")
        parser.add_argument("--image", default="sandman/empty")
        parser.add_argument("--cpu", default="500m")
        parser.add_argument("--memory", default="256Mi")
        parser.add_argument("--prewarm", type=int, default=0, help="warm pods to build first")
        parser.add_argument(
            "--egress",
            choices=("deny", "allow"),
            default="deny",
            help="the job's egress policy (deny needs a host that can isolate sandboxes)",
        )
        parser.add_argument("--keep-job", action="store_true", help="do not drain at the end")
        parser.add_argument("--name", default="", help="job name (default demo-<time>)")
        parser.add_argument(
            "--learner-steps", type=int, default=0, help="simulated learner steps to report"
        )
        parser.add_argument("--learner-scale", type=float, default=1.0, help="phase time scale")
        parser.add_argument(
            "--grade-samples",
            nargs="?",
            const="all",
            default="",
            help="also grade the sample task set: 'all' or names (slugs,clamp,...)",
        )

    def handle(self, *args: Any, **opts: Any) -> None:
        rollouts, concurrency = opts["rollouts"], opts["concurrency"]
        if rollouts < 1 or concurrency < 1 or opts["prewarm"] < 0:
            raise CommandError("--rollouts and --concurrency must be >= 1, --prewarm >= 0")
        token = opts["token"] or demo_token()
        spec = {"cpu": opts["cpu"], "memory": opts["memory"]}
        client = Client(opts["url"], token)
        try:
            job = client.job(
                name=opts["name"] or f"demo-{time.strftime('%H%M%S')}",
                egress=opts["egress"],
                caps={"max_live": max(64, concurrency + opts["prewarm"] + 8)},
            )
            if opts["prewarm"]:
                job.prewarm([{"image": opts["image"], "spec": spec, "count": opts["prewarm"]}])
                warm = wait_for_warm(job, count=opts["prewarm"], deadline_s=120)
                self.stdout.write(f"prewarmed {warm}/{opts['prewarm']} warm sandboxes")
            results = self._run(job, rollouts, concurrency, opts["image"], spec)
            if opts["learner_steps"] > 0:
                self._learner(job, opts["learner_steps"], opts["learner_scale"])
            if opts["grade_samples"]:
                self._grade_samples(job, opts["grade_samples"])
            if not opts["keep_job"]:
                job.drain()
        except SandmanClientError as exc:
            raise CommandError(f"Sandman answered {exc}") from exc
        finally:
            client.close()
        self._summary(job, results)

    def _run(
        self, job: Job, rollouts: int, concurrency: int, image: str, spec: dict[str, Any]
    ) -> list[RolloutResult]:
        lock = threading.Lock()
        results: list[RolloutResult] = []

        def work(i: int) -> None:
            result = one_rollout(job, index=i, image=image, spec=spec)
            with lock:
                results.append(result)
            if not result.ok:
                self.stderr.write(f"rollout {i} failed: {result.error}")

        with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="rollout") as pool:
            list(pool.map(work, range(rollouts)))
        return results

    def _learner(self, job: Job, steps: int, scale: float) -> None:
        """Simulate a learner whose last step ends now, report it, print Sandman's shares."""
        shape = LearnerShape(steps=steps, scale=scale)
        duration = simulate(shape, start=0.0).end
        run = simulate(shape, start=time.time() - duration)
        job.report_trajectories(run.trajectories)
        job.report_steps(run.steps)
        path = job.critical_path()
        shares = " ".join(
            f"{category}={share * 100:.1f}%"
            for category, share in sorted(path["shares"].items(), key=lambda kv: -kv[1])
            if share > 0
        )
        self.stdout.write(
            f"demo_learner job={job.id} steps={path['steps']} "
            f"trajectories={len(run.trajectories)} waiting_share={path['waiting_share']:.3f} "
            f"{shares}"
        )

    def _grade_samples(self, job: Job, which: str) -> None:
        """Grade each chosen sample task's reference patch and the first one's empty patch;
        print each verdict and a summary line."""
        names = samples.NAMES if which == "all" else tuple(which.split(","))
        wanted = {f"sandman-sample__{name}-1" for name in names}
        lines = [line for line in samples.shipped_lines() if line["instance_id"] in wanted]
        if len(lines) != len(wanted):
            raise CommandError(f"--grade-samples: unknown sample in {which!r} ({samples.NAMES})")
        queued = [
            (line["instance_id"], job.grade(task=line["instance_id"], patch=line["patch"]))
            for line in lines
        ]
        first = lines[0]["instance_id"]
        queued.append((f"{first} (empty patch)", job.grade(task=first, patch="")))
        counts: dict[str, int] = {}
        for name, grading in queued:
            data = grading.wait(timeout_s=900).data
            counts[data["verdict"]] = counts.get(data["verdict"], 0) + 1
            self.stdout.write(f"  graded {name}: {data['verdict']} ({data['reason'][:80]})")
        summary = " ".join(f"{k}={v}" for k, v in sorted(counts.items()))
        self.stdout.write(f"demo_grading job={job.id} gradings={len(queued)} {summary}")

    def _summary(self, job: Job, results: list[RolloutResult]) -> None:
        ok = [r for r in results if r.ok]
        sources = {s: sum(1 for r in ok if r.source == s) for s in ("warm", "reused", "created")}
        waits = [r.wait_ms for r in ok]
        line = (
            f"demo_trainer job={job.id} rollouts={len(results)} ok={len(ok)} "
            f"failed={len(results) - len(ok)} "
            f"warm={sources['warm']} reused={sources['reused']} created={sources['created']} "
            f"wait_ms_p50={_pct(waits, 0.5):.1f} wait_ms_p99={_pct(waits, 0.99):.1f} "
            f"rollout_ms_mean={statistics.fmean([r.total_ms for r in ok]) if ok else 0.0:.1f}"
        )
        self.stdout.write(line)
        if len(ok) != len(results):
            raise CommandError(f"{len(results) - len(ok)} of {len(results)} rollouts failed")
