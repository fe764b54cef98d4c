"""REST routes of the sandboxes app, mounted under ``/api/v1/`` (docs/architecture.md §5)."""

from __future__ import annotations

from django.urls import path

from sandboxes.apis.jobs import (
    JobAcquireApi,
    JobCollectionApi,
    JobDetailApi,
    JobDrainApi,
    JobPrewarmApi,
)
from sandboxes.apis.sandboxes import (
    SandboxDetailApi,
    SandboxListApi,
    SandboxReleaseApi,
    SandboxRenewApi,
)
from sandboxes.apis.trajectories import (
    JobCriticalPathApi,
    JobLearnerStepsApi,
    JobTrajectoriesApi,
)

urlpatterns = [
    path("jobs/", JobCollectionApi.as_view(), name="job-list"),
    path("jobs/<int:job_id>/", JobDetailApi.as_view(), name="job-detail"),
    path("jobs/<int:job_id>/acquire/", JobAcquireApi.as_view(), name="job-acquire"),
    path("jobs/<int:job_id>/prewarm/", JobPrewarmApi.as_view(), name="job-prewarm"),
    path("jobs/<int:job_id>/drain/", JobDrainApi.as_view(), name="job-drain"),
    path("jobs/<int:job_id>/trajectories/", JobTrajectoriesApi.as_view(), name="job-trajectories"),
    path(
        "jobs/<int:job_id>/learner-steps/", JobLearnerStepsApi.as_view(), name="job-learner-steps"
    ),
    path(
        "jobs/<int:job_id>/critical-path/", JobCriticalPathApi.as_view(), name="job-critical-path"
    ),
    path("sandboxes/", SandboxListApi.as_view(), name="sandbox-list"),
    path("sandboxes/<int:sandbox_id>/", SandboxDetailApi.as_view(), name="sandbox-detail"),
    path(
        "sandboxes/<int:sandbox_id>/release/", SandboxReleaseApi.as_view(), name="sandbox-release"
    ),
    path("sandboxes/<int:sandbox_id>/renew/", SandboxRenewApi.as_view(), name="sandbox-renew"),
]
