"""The 25 cancellation windows of the paper's Table A21, run end to end on our controller.

Each window is a function over a :class:`Trial`: it arms gates and failure plans, starts
the caller, waits until the gate is REACHED, pulls the trigger, audits, releases and
checks the outcome our design promises; the test then calls ``trial.settle()``.

Triggers are never timers. "Cancel" cancels the trainer's task running
``controller.aacquire`` (the controller owns the create, so the caller leaves at once);
where the paper's window needs cleanup to run in the cancelled task (8, 9, 19-21) we
also cancel the controller's own task running the create (and, in 9, its delete) -- the
strongest cancellation the code can receive short of shutdown. "Times out" advances the
fake clock past ``timeout_s`` while a gate holds the window (the controller waits for
its create on the injected clock, ``ownership.py``). "Drain" calls the drain.

Outcomes in our design differ from the paper's 27 October row where our pool decides
differently, never in ownership: a cancelled or timed-out acquire's late pod becomes a
WARM pod when nobody used it (rollout or grading, docs/architecture.md §3), where the paper
deleted late rollout pods.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from standin.harness.rig import Trial
from standin.harness.windows_cancel import (
    cancel_held,
    timeout_held,
    w01,
    w02,
    w03,
    w04,
    w08,
    w09,
    w13,
    w14,
    w15,
)
from standin.harness.windows_errors import (
    cleanup_delete_fails,
    stored_then,
    w18,
    w22,
    w23,
    w24,
    w25,
)


@dataclass(frozen=True)
class Window:
    number: int
    slug: str
    title: str  # the paper's wording
    outcome: str  # what our controller does
    run: Callable[[Trial], None]
    rig: dict[str, Any] = field(default_factory=dict)  # provider config for this window
    job: dict[str, Any] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return f"table-a21-window-{self.number:02d}-{self.slug}"


WINDOWS: list[Window] = [
    Window(
        1,
        "cancel-in-work-queue",
        "cancel while the create waits in the client's work queue",
        "sent when released; kept warm",
        w01,
    ),
    Window(
        2,
        "cancel-in-admission-stored",
        "cancel during admission; the pod is then stored",
        "kept warm",
        w02,
    ),
    Window(
        3,
        "cancel-in-admission-403",
        "cancel during admission; the create is then rejected (403)",
        "no pod; row ended",
        w03,
    ),
    Window(
        4,
        "timeout-waiting-for-slot",
        "pool acquire times out while its create waits for a create slot",
        "sent when the slot frees; kept warm",
        w04,
        job={"max_creating": 1},
    ),
    Window(
        5,
        "cancel-response-in-flight",
        "cancel while the create response is in flight",
        "kept warm",
        cancel_held("create_stored"),
    ),
    Window(
        6, "cancel-in-ready-wait", "cancel during a Ready wait", "kept warm", cancel_held("ready")
    ),
    Window(
        7,
        "cancel-in-health-probe",
        "cancel during the execd health probe",
        "kept warm",
        cancel_held("work_item", "health"),
    ),
    Window(
        8,
        "second-cancel-during-create-call",
        "second cancel while cleanup waits for the create call",
        "deleted once the create answers",
        w08,
    ),
    Window(
        9,
        "more-cancels-during-cleanup-delete",
        "second and third cancel while the cleanup delete is held",
        "deleted; confirmed by the retry",
        w09,
    ),
    Window(
        10,
        "grading-timeout-in-response",
        "grading acquire times out during the create response; create succeeds",
        "kept warm",
        timeout_held("create_stored", "grading"),
    ),
    Window(
        11,
        "rollout-timeout-in-response",
        "as 10, for a rollout acquire",
        "kept warm",
        timeout_held("create_stored", "rollout"),
    ),
    Window(
        12,
        "rollout-timeout-in-ready-wait",
        "rollout acquire times out while its pod waits for Ready",
        "kept warm",
        timeout_held("ready", "rollout"),
    ),
    Window(
        13,
        "grading-timeout-then-reacquire",
        "as 12, for a grading acquire, then a second acquire of the key",
        "kept warm; the next acquire gets it",
        w13,
    ),
    Window(
        14,
        "timeout-never-ready",
        "as 12, but the pod never becomes Ready",
        "deleted when the budget expires",
        w14,
    ),
    Window(
        15,
        "drain-during-warm-build",
        "drain while a warm build waits for Ready",
        "deleted once it settles",
        w15,
    ),
    Window(
        16,
        "stored-then-504",
        "pod stored, then a 504 answer",
        "read back and deleted",
        stored_then("504_after_store"),
    ),
    Window(
        17,
        "stored-then-reset",
        "pod stored, then the connection resets",
        "read back and deleted",
        stored_then("reset_after_store"),
    ),
    Window(
        18,
        "timeout-then-504-after-store",
        "as 10, but the late result is a 504 after the pod was stored",
        "read back and deleted",
        w18,
    ),
    Window(
        19,
        "cleanup-delete-500",
        "cancel during a Ready wait; cleanup delete answers 500, not applied",
        "pending; deleted by the retry",
        cleanup_delete_fails("500_not_applied"),
    ),
    Window(
        20,
        "cleanup-delete-reply-lost",
        "as 19; the delete is applied but its reply lost",
        "gone; confirmed by the retry",
        cleanup_delete_fails("reset_after_apply"),
    ),
    Window(
        21,
        "cleanup-delete-times-out",
        "as 19; the delete is not applied and its reply times out",
        "pending; deleted by the retry",
        cleanup_delete_fails("hang_not_applied"),
        rig={"request_timeout_s": 0.5},
    ),
    Window(
        22,
        "fails-starting-delete-500",
        "no cancel: pod fails while starting; cleanup delete answers 500",
        "pending; deleted by the retry",
        w22,
    ),
    Window(
        23,
        "destroy-in-use-500",
        "no cancel: destroy of a handed-out sandbox answers 500 (the job's drain)",
        "pending; deleted by the retry",
        w23,
    ),
    Window(
        24,
        "release-in-use-500",
        "no cancel: pool release of a handed-out pod answers 500",
        "pending; deleted by the retry",
        w24,
    ),
    Window(
        25,
        "name-held-by-another-tenant",
        "another tenant's pod already holds the pod's name (409)",
        "no read-delete; the other pod kept",
        w25,
    ),
]
