"""The admin for tasks, task sets, patch captures and gradings.

Tasks never change once stored (a grading must be reproducible from its task), so the task
admin is read-only but for the "retire" action, which goes through ``task_retire`` (the one
transition service). Captures and gradings are read-only audit records (a verdict is written
by the grading runner only). Task sets are editable groups. Certifications are read-only
records (every preflight verdict, the configuration hash, the chain), written by preflight.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone

from grading.models import Certification, Grading, PatchCapture, Task, TaskSet
from grading.services import task_retire
from grading.states import TASK_TERMINAL


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Task)
class TaskAdmin(ReadOnlyAdmin):
    list_display = ("instance_id", "repo", "image", "state", "created_at")
    list_filter = ("state", "repo", "task_sets")
    search_fields = ("instance_id", "repo", "base_commit")
    ordering = ("instance_id",)
    actions = ["retire"]

    @admin.action(description="Retire the selected tasks (no new gradings)")
    def retire(self, request: HttpRequest, queryset: QuerySet[Task]) -> None:
        now = timezone.now()
        retired = 0
        for task in queryset.exclude(state__in=TASK_TERMINAL):
            task_retire(task=task, now=now)
            retired += 1
        self.message_user(request, f"{retired} task(s) retired.", messages.SUCCESS)

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        # Read-only for rows, yet the retire action stays for staff who may change tasks.
        actions = super().get_actions(request)
        if not request.user.has_perm("grading.change_task"):
            actions.pop("retire", None)
        return actions


@admin.register(TaskSet)
class TaskSetAdmin(admin.ModelAdmin):
    list_display = ("name", "created_at")
    search_fields = ("name", "tasks__instance_id")
    filter_horizontal = ("tasks",)
    readonly_fields = ("created_by", "created_at")

    def save_model(self, request: HttpRequest, obj: TaskSet, form: Any, change: bool) -> None:
        if not change:
            obj.created_by_id = request.user.pk
            obj.created_at = timezone.now()
        super().save_model(request, obj, form, change)


@admin.register(PatchCapture)
class PatchCaptureAdmin(ReadOnlyAdmin):
    list_display = ("id", "task", "job_id", "sandbox_id", "sha256", "created_at")
    list_filter = ("task__repo",)
    search_fields = ("sha256", "task__instance_id")
    ordering = ("-created_at",)


class ReasonFilter(admin.SimpleListFilter):
    """The reason's kind: the part before the first ':' (``tests_failed``, ``no_verdict`` ...)."""

    title = "reason"
    parameter_name = "reason_kind"
    KINDS = ("resolved", "tests_failed", "patch_did_not_apply", "no_verdict")

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(kind, kind) for kind in self.KINDS]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        if self.value() in self.KINDS:
            return queryset.filter(reason__startswith=self.value())
        return queryset


@admin.register(Grading)
class GradingAdmin(ReadOnlyAdmin):
    list_display = (
        "id",
        "task",
        "job",
        "state",
        "verdict",
        "reason",
        "shadow_agrees",
        "created_at",
    )
    list_filter = ("verdict", "state", ReasonFilter, "preflight_kind", "job", "shadow_agrees")
    search_fields = ("task__instance_id", "patch_sha256")
    ordering = ("-created_at",)
    list_select_related = ("task", "job")


@admin.register(Certification)
class CertificationAdmin(ReadOnlyAdmin):
    list_display = ("id", "task_set", "job", "state", "admitted_count", "config_hash", "created_at")
    list_filter = ("state", "task_set", "job")
    search_fields = ("task_set__name", "config_hash", "chain")
    ordering = ("-created_at",)
    list_select_related = ("task_set", "job")

    @admin.display(description="admitted")
    def admitted_count(self, obj: Certification) -> str:
        return f"{len(obj.admitted)} of {len(obj.results)}"
