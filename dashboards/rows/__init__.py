"""Row shapes of the operator pages: pure frozen dataclasses, one module per page.

Rule: no Django here; each row class names the columns of its table and CSV (``TABLE``).
"""
