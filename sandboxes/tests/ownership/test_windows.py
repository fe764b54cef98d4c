"""Table A21: every cancellation window, end to end, leaves no pod without an owner.

One test per window (ids ``table-a21-window-NN-...``). Each runs the real controller on
the real Kubernetes provider against the stand-in cluster over HTTP, with a real execd
per pod and a sentinel pod of another tenant. The independent auditor (the stand-in's
own pod store, ``standin.harness.support.audit``) runs while the window is held, after
the release and during the drain; ``Trial.settle`` then requires 0 pods of the job, no
anchor, no pending delete, and the sentinel(s) with their original uid. What each
window's trigger and outcome are in our design: ``standin/harness/windows.py``.
"""

from __future__ import annotations

import pytest

from sandboxes import labels as L
from standin.harness.rig import Trial
from standin.harness.support import NS, SENTINEL, audit
from standin.harness.windows import WINDOWS, Window


@pytest.mark.parametrize("window", WINDOWS, ids=[w.id for w in WINDOWS])
def test_the_window_leaves_no_pod_without_an_owner_and_nothing_after_the_drain(
    make_rig, window: Window
):
    """Table A21, window N (see the test id): audited held, released and drained."""
    rig = make_rig(**window.rig)
    trial = Trial(rig, **window.job)
    window.run(trial)
    trial.settle()
    assert trial.audits and all(a.ownerless == [] for a in trial.audits)
    assert trial.subject  # the window's pod was identified (the gate or answer named it)


def test_the_auditor_reports_a_labelled_pod_that_no_record_owns(make_rig):
    """The control: an audit that could never fail would prove nothing."""
    rig = make_rig(run_execd=False)
    name = "sm-424242-000000000000"
    rig.cluster.put_pod(
        NS,
        {
            "metadata": {"name": name, "labels": {L.MANAGED_BY: L.VALUE_MANAGED_BY}},
            "spec": {"containers": [{"name": "sandbox", "image": "task/img:1"}]},
        },
    )
    report = audit(rig.cluster, rig.controller, at="control")
    assert report.ownerless == [name] and report.others == {SENTINEL: rig.sentinels[SENTINEL]}
    trial = Trial(rig)
    with pytest.raises(AssertionError, match="without an owner"):
        trial.audit("control")
    rig.cluster.delete_pod(NS, name)
    assert audit(rig.cluster, rig.controller, at="after").ownerless == []
