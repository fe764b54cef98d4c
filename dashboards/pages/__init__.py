"""The operator pages (views), one module per page; ``pages.charts`` builds the live chart
pages.

Rule: every view goes through ``dashboards.access`` (staff only) and every table or chart
export through ``dashboards.export``.
"""
