"""The Table A21 ownership harness (paper Appendix F): the stand-in cluster driving Sandman.

Unlike the rest of ``standin``, this subpackage imports Django and ``sandboxes`` on
purpose: it runs Sandman's real controller on its real Kubernetes provider against a
stand-in cluster over HTTP, and audits the stand-in's own pod store against the
controller's database rows. ``sandboxes/tests/ownership/`` (the window, randomized and
restart tests) and ``bench/cancellation_windows.py`` use it; nothing here depends on pytest.

* ``support`` -- the provider against a stand-in, the controller's loop, a trainer's loop
  (:class:`~standin.harness.support.Caller`) and the independent auditor;
* ``jobs`` -- the job a trial drives (image, spec, ``make_job`` through the service);
* ``rig`` -- :class:`~standin.harness.rig.Rig` (stand-in + controller + trainer loop) and
  :class:`~standin.harness.rig.Trial` (one job driven through one window);
* ``windows``, ``windows_cancel``, ``windows_errors`` -- every cancellation window of
  Table A21 as a trigger and its expected outcome;
* ``randomized`` -- seeded draws of gate, trigger and failure plans.

Rules a reader must not break: Django and ``sandboxes`` imports stay inside this
subpackage (the rest of ``standin`` is Django-free, ``standin/tests/test_isolation.py``
checks it); nothing here imports a test module (``sandboxes.tests``); its modules need
``django.setup()`` before they are imported, and a trial needs a migrated database.
"""

from __future__ import annotations
