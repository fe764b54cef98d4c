"""Root URL map: admin, REST v1, schema, health, metrics, the operator pages (dashboards)."""

from __future__ import annotations

from django.contrib import admin
from django.urls import include, path, re_path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from sandboxes.metrics import metrics_view
from sandman_site import views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("healthz", views.healthz, name="healthz"),
    path("readyz", views.readyz, name="readyz"),
    path("metrics", metrics_view, name="metrics"),
    path("api/v1/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/v1/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
    path("api/v1/", include("sandboxes.urls")),
    path("api/v1/", include("grading.urls")),
    path("api/v1/", include("incidents.urls")),
    # Anything else under /api/ is the API's own JSON 404, with DEBUG on too (never HTML).
    re_path(r"^api/", views.not_found, name="api-not-found"),
    path("favicon.ico", views.favicon, name="favicon"),
    path("", include("dashboards.urls")),
]

handler404 = "sandman_site.views.not_found"
handler500 = "sandman_site.views.server_error"
