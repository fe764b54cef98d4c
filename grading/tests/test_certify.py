"""The preflight rule and the certification chain, as pure functions (``grading.certify``)."""

from __future__ import annotations

import hashlib

from grading import certify


def _v(kind: str, verdict: str, reason: str = "") -> dict[str, str]:
    return {"kind": kind, "verdict": verdict, "reason": reason}


R, E = certify.REFERENCE, certify.EMPTY


def test_a_task_is_admitted_after_two_resolved_references_and_two_unresolved_empties():
    steps = []
    verdicts: list[dict[str, str]] = []
    for graded in (_v(R, "resolved"), _v(R, "resolved"), _v(E, "unresolved"), _v(E, "unresolved")):
        step = certify.next_step(verdicts)
        steps.append(step.grade)
        verdicts.append(graded | {"kind": step.grade or ""})
    assert steps == [R, R, E, E]
    assert certify.next_step(verdicts).admitted is True


def test_preflight_stops_at_the_first_grading_that_disagrees():
    first_ref_fails = certify.next_step([_v(R, "unresolved", "tests_failed: 1 of 1")])
    assert (first_ref_fails.admitted, first_ref_fails.grade) == (False, None)
    assert first_ref_fails.reason.startswith("reference patch unresolved")
    flaky = certify.next_step([_v(R, "resolved"), _v(R, "no_verdict", "timeout")])
    assert flaky.admitted is False and "no_verdict" in flaky.reason
    unchecked = certify.next_step([_v(R, "resolved"), _v(R, "resolved"), _v(E, "resolved")])
    assert unchecked.admitted is False
    assert unchecked.reason == "empty patch resolved: the tests do not check the fix"


def test_the_chain_pins_the_configuration_and_every_admitted_task_in_order():
    h0 = hashlib.sha256(b"sandman-certification\ncfg").hexdigest()
    h1 = hashlib.sha256((h0 + "a").encode()).hexdigest()
    assert certify.chain("cfg", ["a"]) == h1
    assert certify.chain("cfg", ["a", "b"]) != certify.chain("cfg", ["b", "a"])
    assert certify.chain("cfg", ["a"]) != certify.chain("cfg2", ["a"])


def test_configuration_differences_name_each_field_with_both_values():
    a = certify.job_grading_config(
        egress="deny", reuse_enabled=False, reuse_max_uses=8, backend="local"
    )
    b = certify.job_grading_config(
        egress="allow", reuse_enabled=False, reuse_max_uses=3, backend="local"
    )
    assert certify.canonical_hash(a) == certify.canonical_hash(dict(reversed(list(a.items()))))
    assert certify.config_differences(a, b) == ["egress: certified 'deny', job 'allow'"]
