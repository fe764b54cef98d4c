"""Django admin for operators: jobs, sandboxes with their timelines, acquisitions, deletes.

Read-mostly: state changes go through the controller and services, never through admin
forms, so every model here is read-only in the admin (a hand-edited state would bypass
the transition map and the pending-delete rule).
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from rest_framework.authtoken.admin import TokenAdmin
from rest_framework.authtoken.models import TokenProxy

from sandboxes.models import Acquisition, Job, PendingDelete, Sandbox, SandboxEvent


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class SandboxEventInline(admin.TabularInline):
    model = SandboxEvent
    extra = 0
    fields = ("at", "kind", "detail")
    readonly_fields = fields
    can_delete = False
    ordering = ("at", "id")

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Job)
class JobAdmin(ReadOnlyAdmin):
    list_display = (
        "id",
        "name",
        "owner",
        "state",
        "rate_per_s",
        "burst",
        "max_live",
        "warm_per_key",
        "egress",
        "created_at",
    )
    list_filter = ("state", "egress", "reuse_enabled")
    search_fields = ("name", "owner__username", "trainer_pod_name")
    exclude = ("execd_key",)  # the job's secret: its sandboxes' tokens derive from it


@admin.register(Sandbox)
class SandboxAdmin(ReadOnlyAdmin):
    list_display = (
        "id",
        "name",
        "job",
        "role",
        "state",
        "source",
        "image",
        "node",
        "requested_at",
        "ready_at",
        "deleted_at",
    )
    list_filter = ("state", "role", "source", "backend")
    search_fields = ("name", "image", "node", "backend_uid")
    exclude = ("token",)  # the per-sandbox secret is never shown
    inlines = [SandboxEventInline]
    date_hierarchy = "requested_at"


@admin.register(Acquisition)
class AcquisitionAdmin(ReadOnlyAdmin):
    list_display = (
        "id",
        "job",
        "role",
        "outcome",
        "source",
        "queue_ms",
        "create_ms",
        "wait_ms",
        "started_at",
    )
    list_filter = ("outcome", "source", "role")
    date_hierarchy = "started_at"


@admin.register(PendingDelete)
class PendingDeleteAdmin(ReadOnlyAdmin):
    list_display = ("name", "backend", "reason", "attempts", "last_error", "next_attempt_at")
    search_fields = ("name",)


# DRF's token admin lists every token's key: an operator's screen (or a screenshot of it)
# would hand out trainers' credentials. Same admin, without the key column.
admin.site.unregister(TokenProxy)


@admin.register(TokenProxy)
class TrainerTokenAdmin(TokenAdmin):
    list_display = ("user", "created")
