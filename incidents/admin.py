"""The admin for incident records: list, filters, search, paper-shaped form, CSV export.

Audit fields are read-only and stamped on save (``recorded_by`` / ``recorded_at`` on
add, ``status_changed_at`` on a status change); a status change must be a listed move
(``incidents.states``), checked in the form so the operator sees the refusal on the field.
The list shows whether an account is counted in the accounting or overlaps an earlier
case (``incidents.selectors.with_overlap``).
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.utils.html import format_html

from incidents import rules, selectors
from incidents.exports import incidents_csv
from incidents.models import TEXT_FIELDS, Incident, OwnerlessPod
from incidents.states import INCIDENT_COLOURS, IncidentStatus, transition_allowed


class RootCauseClassFilter(admin.SimpleListFilter):
    title = "root-cause class"
    parameter_name = "cause"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        exact = [(key, _label(key)) for key in rules.CLASS_ORDER]
        involves = [
            ("has:implementation", "involves sandbox implementation"),
            ("has:kubernetes_default", "involves a Kubernetes default"),
            ("has:cluster_service", "involves cluster or shared service"),
        ]
        return exact + involves

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        value = self.value()
        if not value or value not in dict(self.lookup_choices):
            return queryset
        return queryset.filter(selectors.cause_class_q(value))


class AccountFilter(admin.SimpleListFilter):
    title = "GPU-hour account"
    parameter_name = "account"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("yes", "has an account"), ("no", "no account")]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        if self.value() == "yes":
            return queryset.filter(selectors.ACCOUNT)
        if self.value() == "no":
            return queryset.exclude(selectors.ACCOUNT)
        return queryset


def _label(key: str) -> str:
    parts = set() if key == "not_established" else set(key.split("+"))
    return rules.cause_class_label(
        implementation="implementation" in parts,
        kubernetes_default="kubernetes_default" in parts,
        cluster_service="cluster_service" in parts,
    )


class IncidentForm(forms.ModelForm):
    class Meta:
        model = Incident
        fields = "__all__"

    def clean_status(self) -> str:
        status = self.cleaned_data["status"]
        before = self.instance.status if self.instance.pk else None
        if before and status != before and not transition_allowed(before, status):
            raise forms.ValidationError(
                f"An incident cannot move from {before} to {status}; reopen it first."
            )
        return status


@admin.register(Incident)
class IncidentAdmin(admin.ModelAdmin):
    form = IncidentForm
    list_display = (
        "title",
        "started_at",
        "stage",
        "root_cause_class",
        "evidence_kind",
        "status_badge",
        "gpu_hours_low",
        "gpu_hours_high",
        "gpu_hours_basis",
        "accounting",
    )
    list_filter = (
        "stage",
        RootCauseClassFilter,
        "evidence_kind",
        "status",
        "gpu_hours_basis",
        AccountFilter,
        "detector_key",
    )
    search_fields = TEXT_FIELDS
    date_hierarchy = "started_at"
    raw_id_fields = ("jobs", "sandboxes")
    readonly_fields = (
        "uid",
        "recorded_by",
        "recorded_at",
        "status_changed_at",
        "updated_at",
        "detector_key",
        "detector_window",
        "detector_detail",
    )
    actions = ("export_csv",)
    fieldsets = (
        ("Case", {"fields": ("title", ("started_at", "ended_at"), "stage", "workload", "status")}),
        ("What happened", {"fields": ("what_happened", "how_found")}),
        (
            "Cause",
            {
                "fields": (
                    "cause",
                    (
                        "cause_in_implementation",
                        "cause_in_kubernetes_default",
                        "cause_in_cluster_service",
                    ),
                    "trigger",
                ),
                "description": "Root-cause class: tick every part that applies; none ticked "
                "means not established.",
            },
        ),
        ("Fix", {"fields": ("fix", "how_verified", "evidence_kind")}),
        (
            "Effect",
            {
                "fields": ("effect", ("gpu_hours_low", "gpu_hours_high", "gpu_hours_basis")),
                "description": "GPU-hour bounds are upper bounds; give both bounds and a "
                "basis, or none (a single value: the same number twice).",
            },
        ),
        ("Links", {"fields": ("jobs", "sandboxes")}),
        (
            "Detector",
            {
                "fields": ("detector_key", "detector_window", "detector_detail"),
                "classes": ("collapse",),
            },
        ),
        (
            "Audit",
            {"fields": ("uid", "recorded_by", "recorded_at", "status_changed_at", "updated_at")},
        ),
    )

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return selectors.with_overlap(super().get_queryset(request))

    @admin.display(description="root-cause class")
    def root_cause_class(self, obj: Incident) -> str:
        return obj.cause_class_label

    @admin.display(description="status", ordering="status")
    def status_badge(self, obj: Incident) -> str:
        return format_html(
            '<span style="color:{};font-weight:bold">{}</span>',
            INCIDENT_COLOURS.get(IncidentStatus(obj.status), "#000"),
            obj.get_status_display(),
        )

    @admin.display(description="accounting")
    def accounting(self, obj: Incident) -> str:
        if not obj.has_account:
            return "—"
        overlap = getattr(obj, "overlaps_with", None)
        if overlap:
            return format_html("not counted: a job overlaps case #{}", overlap)
        return "counted"

    def save_model(self, request: HttpRequest, obj: Incident, form: Any, change: bool) -> None:
        now = timezone.now()
        if not change:
            obj.recorded_by = request.user  # type: ignore[assignment]  # staff-only admin: a User
            obj.recorded_at = now
            obj.status_changed_at = now
        elif "status" in form.changed_data:
            obj.status_changed_at = now
        super().save_model(request, obj, form, change)

    @admin.action(description="Export selected incidents as CSV")
    def export_csv(self, request: HttpRequest, queryset: QuerySet) -> HttpResponse:
        rows = queryset.select_related("recorded_by").prefetch_related("jobs", "sandboxes")
        response = HttpResponse(
            incidents_csv(rows.order_by("started_at", "id")), content_type="text/csv"
        )
        stamp = timezone.now().strftime("%Y%m%dT%H%M%SZ")
        response["Content-Disposition"] = f'attachment; filename="incidents-{stamp}.csv"'
        return response


@admin.register(OwnerlessPod)
class OwnerlessPodAdmin(admin.ModelAdmin):
    list_display = ("name", "first_seen_at", "incident")
    search_fields = ("name",)
    raw_id_fields = ("incident",)
    readonly_fields = ("name", "first_seen_at", "incident")
