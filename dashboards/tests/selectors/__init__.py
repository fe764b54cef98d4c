"""Tests of ``dashboards.selectors``."""
