"""Root URL map: admin, REST v1, schema, health, metrics, the operator pages (dashboards)."""

from __future__ import annotations

from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView

from sandboxes.metrics import metrics_view
from sandman_site import views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("healthz", views.healthz, name="healthz"),
    path("readyz", views.readyz, name="readyz"),
    path("metrics", metrics_view, name="metrics"),
    path("api/v1/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/v1/", include("sandboxes.urls")),
    path("api/v1/", include("grading.urls")),
    path("api/v1/", include("incidents.urls")),
    path("favicon.ico", views.favicon, name="favicon"),
    path("", include("dashboards.urls")),
]

handler404 = "sandman_site.views.not_found"
handler500 = "sandman_site.views.server_error"
