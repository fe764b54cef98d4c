"""The grading app's REST views: ``tasks`` (tasks, task sets), ``gradings`` (capture,
gradings), ``certifications`` (preflight, certifications); ``fields`` holds the bounded
serializer fields they use."""

from __future__ import annotations

from grading.apis.certifications import CertificationDetailApi, TaskSetPreflightApi
from grading.apis.gradings import GradingCreateApi, GradingDetailApi, SandboxCaptureApi
from grading.apis.tasks import (
    TaskCollectionApi,
    TaskCreateApi,
    TaskDetailApi,
    TaskSetCollectionApi,
    TaskSetDetailApi,
)

__all__ = [
    "CertificationDetailApi",
    "TaskSetPreflightApi",
    "GradingCreateApi",
    "GradingDetailApi",
    "SandboxCaptureApi",
    "TaskCollectionApi",
    "TaskCreateApi",
    "TaskDetailApi",
    "TaskSetCollectionApi",
    "TaskSetDetailApi",
]
