"""Randomized ownership trials: N seeded draws of gate, trigger and failure plans.

CI runs ``SANDMAN_OWNERSHIP_TRIALS`` trials (default 50) with seed
``SANDMAN_OWNERSHIP_SEED`` (default 1) on one rig; ``bench/cancellation_windows.py``
runs 1,000. Every trial must reach its gate, never leave a pod without an owner, and
end with no pod of its job, no anchor, no pending delete and every other tenant's pod
(the sentinel and any pod that took one of our names) with its original uid.
"""

from __future__ import annotations

import os
from collections import Counter

from standin.harness.randomized import draw, run_trial
from standin.harness.support import sandman_pods

TRIALS = int(os.environ.get("SANDMAN_OWNERSHIP_TRIALS", "50"))
SEED = int(os.environ.get("SANDMAN_OWNERSHIP_SEED", "1"))


def test_random_gates_triggers_and_failures_never_leave_a_pod_without_an_owner(make_rig):
    rig = make_rig(nodes=3, seed=SEED)
    done = []
    for index in range(TRIALS):
        d = draw(index, SEED)
        try:
            done.append(run_trial(rig, d))
        except Exception as exc:
            raise AssertionError(f"trial {d.as_dict()} failed: {exc}") from exc
    assert all(d.reached for d in done)
    assert [d.ownerless for d in done if d.ownerless] == []
    assert sandman_pods(rig.cluster) == []
    # The draw really varies what it exercises (a narrow draw would prove little).
    assert len(Counter(d.gate for d in done)) >= min(TRIALS, 5)
    assert len(Counter(d.trigger for d in done)) >= min(TRIALS, 4)
