"""A month of synthetic records for the dashboards (``manage.py seed_history``): the paper's
distributions drawn by :mod:`dashboards.seeding.history`, written in bulk by
:mod:`dashboards.seeding.writer` (``COPY`` on PostgreSQL)."""
