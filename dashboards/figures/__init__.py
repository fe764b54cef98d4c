"""Charts of the operator pages as pure functions, one module per page; shared axes and
layout in ``figures.layout``.

Rule: no Django here: rows in, Plotly figure out. Importing this package imports numpy once
(when installed), before any request thread builds a figure: see below.
"""

from __future__ import annotations

try:
    # Plotly's validators read numpy from sys.modules without the import lock, so the first
    # figures built in two request threads at once can meet a half-imported numpy
    # ("partially initialized module 'numpy'"). Import it once, here, before any thread.
    import numpy  # noqa: F401
except ImportError:  # plotly works without numpy, and then there is nothing to race on
    pass
