"""Tests of ``dashboards.pages``."""
