"""The grading app's REST views: ``tasks`` (tasks, task sets), ``gradings`` (capture,
gradings); ``fields`` holds the bounded serializer fields both use."""

from __future__ import annotations

from grading.apis.gradings import GradingCreateApi, GradingDetailApi, SandboxCaptureApi
from grading.apis.tasks import (
    TaskCollectionApi,
    TaskCreateApi,
    TaskDetailApi,
    TaskSetCollectionApi,
    TaskSetDetailApi,
)

__all__ = [
    "GradingCreateApi",
    "GradingDetailApi",
    "SandboxCaptureApi",
    "TaskCollectionApi",
    "TaskCreateApi",
    "TaskDetailApi",
    "TaskSetCollectionApi",
    "TaskSetDetailApi",
]
