"""Rollups: derived per-bucket tables behind the operator charts (issue 11 item 6).

The raw rows (sandboxes, acquisitions) stay the source of truth; see ``rollups.models``.
"""
