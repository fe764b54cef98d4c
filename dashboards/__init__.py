"""The operator pages: live charts, their data and CSV, the incident accounting, the websocket.

Layout (one idea per module): ``window`` (the time range a page shows), ``sql`` (database
aggregates), ``rows/`` (pure row shapes), ``selectors/`` (one aggregate query per chart),
``figures/`` (pure Plotly figures), ``pages/`` (the views), ``access`` (the one staff rule),
``export`` (the one JSON/CSV helper), ``consumers`` and ``routing`` (the live push socket).

Rule a reader must not break: the services of other apps never import this package; they
publish through the neutral ``sandman_site.live``. Keep this file free of imports: the pure
modules (``rows``, ``figures``, ``window``, ``stats``) must import without Django.
"""
