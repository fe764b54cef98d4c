"""Tests of ``dashboards.figures``."""
