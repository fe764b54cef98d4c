"""Reads behind the operator pages, one module per page: one aggregate query per chart.

Rule: aggregate in the database (``dashboards.sql``); no per-row loops, no N+1, no clock.
"""
