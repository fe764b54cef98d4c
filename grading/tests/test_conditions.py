"""Declared run conditions against ``/probe`` readings (§4.5): contradiction refuses,
unreadable is recorded and never trusted, undeclared is not compared."""

from __future__ import annotations

from grading.conditions import CONTRADICTION, MATCH, UNREADABLE, check_conditions, refusal


def _v(value, source="test"):
    return {"value": value, "source": source}


READINGS = {
    "egress": _v("denied"),
    "cpu_quota": _v(0.5),
    "visible_cpus": _v(2),
    "memory_limit": _v(256 * 2**20),
    "time_zone": _v("UTC"),
    "hash_seed": _v(None),
    "time_limit": _v(300.0),
    "user": _v("nobody"),
}


def test_a_sandbox_that_matches_every_declared_field_is_accepted():
    declared = {
        "egress": "deny",
        "cpu_quota_millis": 500,
        "visible_cpus": 2,
        "memory_limit_bytes": 256 * 2**20,
        "time_zone": "UTC",
        "hash_seed": "random",
        "time_limit_s": 300,
        "user": "nobody",
    }
    checks = check_conditions(declared, READINGS)
    assert [c.outcome for c in checks] == [MATCH] * 8
    assert refusal(checks) is None


def test_a_readable_contradiction_refuses_and_names_both_values():
    checks = check_conditions({"egress": "allow", "time_zone": "Asia/Tokyo"}, READINGS)
    assert [c.outcome for c in checks] == [CONTRADICTION, CONTRADICTION]
    sentence = refusal(checks)
    assert sentence is not None
    assert "egress: declared 'allow', read 'denied'" in sentence
    assert "time_zone: declared 'Asia/Tokyo', read 'UTC'" in sentence


def test_an_unreadable_field_is_recorded_and_neither_refuses_nor_matches():
    readings = {**READINGS, "cpu_quota": {"unreadable": "no cpu.max"}}
    [check] = check_conditions({"cpu_quota_millis": 1000}, readings)
    assert (check.outcome, check.read, check.source) == (UNREADABLE, None, "no cpu.max")
    assert refusal([check]) is None


def test_an_unlimited_quota_contradicts_a_declared_one_and_a_shorter_time_limit_too():
    readings = {**READINGS, "cpu_quota": _v("unlimited"), "time_limit": _v(60.0)}
    checks = check_conditions({"cpu_quota_millis": 1000, "time_limit_s": 1800}, readings)
    assert [c.outcome for c in checks] == [CONTRADICTION, CONTRADICTION]


def test_a_pinned_hash_seed_must_be_the_one_read():
    assert check_conditions({"hash_seed": "0"}, {"hash_seed": _v("0")})[0].outcome == MATCH
    assert check_conditions({"hash_seed": "0"}, READINGS)[0].outcome == CONTRADICTION
