"""REST routes of the grading app, mounted under ``/api/v1/`` (docs/architecture.md §5)."""

from __future__ import annotations

from django.urls import path

from grading.apis import (
    CertificationDetailApi,
    GradingCreateApi,
    GradingDetailApi,
    SandboxCaptureApi,
    TaskCollectionApi,
    TaskDetailApi,
    TaskSetCollectionApi,
    TaskSetDetailApi,
    TaskSetPreflightApi,
)

urlpatterns = [
    path("tasks/", TaskCollectionApi.as_view(), name="task-list"),
    path("tasks/<str:instance_id>/", TaskDetailApi.as_view(), name="task-detail"),
    path("task-sets/", TaskSetCollectionApi.as_view(), name="task-set-list"),
    path("task-sets/<int:task_set_id>/", TaskSetDetailApi.as_view(), name="task-set-detail"),
    path(
        "task-sets/<int:task_set_id>/preflight/",
        TaskSetPreflightApi.as_view(),
        name="task-set-preflight",
    ),
    path(
        "certifications/<int:certification_id>/",
        CertificationDetailApi.as_view(),
        name="certification-detail",
    ),
    path("gradings/", GradingCreateApi.as_view(), name="grading-create"),
    path("gradings/<int:grading_id>/", GradingDetailApi.as_view(), name="grading-detail"),
    # On the rollout sandbox (a sandboxes-app path, served by grading: capture needs a task).
    path(
        "sandboxes/<int:sandbox_id>/capture/", SandboxCaptureApi.as_view(), name="sandbox-capture"
    ),
]
