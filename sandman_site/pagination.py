"""The one pagination of the API's lists: ``?limit=&offset=``, bounded.

``{count, next, previous, results}``; ``limit`` defaults to ``PAGE_SIZE`` and is clamped
to ``SANDMAN_API_MAX_PAGE_SIZE`` (a larger one answers that many, never an error);
an ``offset`` past the end is an empty page. The document declares this envelope for
every paginated ``GET`` (``sandman_site.openapi``).
"""

from __future__ import annotations

from django.conf import settings
from rest_framework.pagination import LimitOffsetPagination
from rest_framework.views import APIView

from sandman_site.parsers import I64_MAX


class Page(LimitOffsetPagination):
    """LimitOffsetPagination with a maximum page size from the settings."""

    def __init__(self) -> None:
        self.max_limit = int(settings.SANDMAN_API_MAX_PAGE_SIZE)

    def get_schema_operation_parameters(self, view: APIView) -> list[dict]:
        parameters = super().get_schema_operation_parameters(view)
        for parameter in parameters:
            schema = parameter["schema"]
            schema["minimum"] = 0
            schema["maximum"] = (
                self.max_limit if parameter["name"] == self.limit_query_param else I64_MAX
            )
        return parameters
