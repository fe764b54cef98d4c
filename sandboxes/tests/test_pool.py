"""The pool's books and decisions as pure logic: no Django, no I/O, a fake clock."""

from __future__ import annotations

from sandboxes.pool import (
    JobPool,
    PoolKey,
    PoolLimits,
    Purpose,
    Settle,
    WarmPod,
    key_hash,
    reuse_decision,
)
from standin.clock import FakeClock

IMAGE = "sandman/empty"


def key(cpu: int = 1000, mem: int = 2**30, ws: int | None = None, image: str = IMAGE) -> PoolKey:
    return PoolKey(
        image=image, base_commit=None, cpu_millis=cpu, memory_bytes=mem, workspace_bytes=ws
    )


def pool(clock: FakeClock, **limits) -> JobPool:
    base = {"max_live": 10, "max_creating": 4, "warm_per_key": 0, "idle_timeout_s": 300.0}
    base.update(limits)
    return JobPool(job_id=1, limits=PoolLimits(**base), clock=clock)


def warm_up(p: JobPool, k: PoolKey, sandbox_id: int, clock: FakeClock) -> None:
    ticket = p.admit(k, purpose=Purpose.WARM).ticket
    assert ticket is not None
    assert p.settle(ticket, ready=True) is Settle.WARM
    p.add_warm(WarmPod(sandbox_id=sandbox_id, key=k, since=clock()))


def test_key_hash_is_stable_short_and_separates_every_field_of_the_key():
    base = key()
    assert key_hash(base) == key_hash(key()) and len(key_hash(base)) == 16
    variants = [
        key(cpu=2000),
        key(mem=2**31),
        key(ws=2**30),
        key(image="other"),
        PoolKey(IMAGE, "abc123", 1000, 2**30, None),
    ]
    assert len({key_hash(v) for v in variants} | {key_hash(base)}) == len(variants) + 1


def test_a_warm_pod_is_handed_out_only_to_a_request_with_an_equal_spec():
    clock = FakeClock()
    p = pool(clock)
    warm_up(p, key(cpu=2000, mem=2**31), 7, clock)
    assert p.take_warm(key(cpu=1000, mem=2**31), "rollout") is None  # smaller cpu
    assert p.take_warm(key(cpu=2000, mem=2**32), "rollout") is None  # bigger memory
    assert p.take_warm(key(cpu=2000, mem=2**31, ws=2**30), "rollout") is None  # workspace
    taken = p.take_warm(key(cpu=2000, mem=2**31), "rollout")
    assert taken is not None and taken.sandbox_id == 7
    assert p.checking == {7: key(cpu=2000, mem=2**31)}
    p.hand_out(7, taken.key)
    assert p.in_use == {7: taken.key} and p.warm_count == 0 and p.live_count == 1


def test_the_oldest_warm_pod_of_a_key_goes_first():
    clock = FakeClock()
    p = pool(clock)
    warm_up(p, key(), 1, clock)
    clock.advance(5)
    warm_up(p, key(), 2, clock)
    assert p.take_warm(key(), "rollout").sandbox_id == 1


def test_a_checked_reuse_pod_serves_only_its_own_role():
    clock = FakeClock()
    p = pool(clock)
    p.add_warm(WarmPod(sandbox_id=3, key=key(), since=clock(), role="grading", reused=True))
    assert p.take_warm(key(), "rollout") is None
    assert p.take_warm(key(), "grading").sandbox_id == 3


def test_admission_stops_at_max_live_counting_creating_warm_checking_and_in_use():
    clock = FakeClock()
    p = pool(clock, max_live=3)
    warm_up(p, key(cpu=500), 1, clock)  # warm, other key
    p.take_warm(key(cpu=500), "rollout")  # now checking
    p.hand_out(1, key(cpu=500))  # in use
    assert p.admit(key(), purpose=Purpose.ACQUIRE).admitted  # creating: 2 live
    assert p.admit(key(), purpose=Purpose.ACQUIRE).admitted  # 3 live
    refused = p.admit(key(), purpose=Purpose.ACQUIRE)
    assert not refused.admitted and refused.evicted is None
    assert p.live_count == 3


def test_an_acquire_at_the_cap_evicts_the_longest_idle_warm_pod_of_another_key():
    clock = FakeClock()
    p = pool(clock, max_live=2)
    p.note_request(key(cpu=100))
    warm_up(p, key(cpu=100), 1, clock)
    clock.advance(10)
    p.note_request(key(cpu=200))
    warm_up(p, key(cpu=200), 2, clock)
    admission = p.admit(key(), purpose=Purpose.ACQUIRE)
    assert admission.admitted and admission.evicted.sandbox_id == 1
    assert p.live_count == 2  # one warm pod gone, one create admitted
    assert not p.admit(key(cpu=300), purpose=Purpose.WARM).admitted  # builds never evict


def test_at_the_cap_the_offer_to_evict_is_the_longest_idle_of_another_key_and_only_then():
    clock = FakeClock()
    p = pool(clock, max_live=3)
    for sandbox_id, cpu in ((1, 100), (2, 200)):
        p.note_request(key(cpu=cpu))
        warm_up(p, key(cpu=cpu), sandbox_id, clock)
        clock.advance(10)
    p.stamped(p.offer_all(), {1, 2})
    assert p.take_offered_to_evict(key()) is None  # under the cap: nothing to evict
    p.note_request(key())
    warm_up(p, key(), 3, clock)  # at the cap, a warm pod of another key than cpu=100's
    assert p.take_offered_to_evict(key(cpu=100)) is None  # admit evicts that warm pod

    assert p.take_offered_to_evict(key(cpu=300)) is None  # pod 3 is warm: admit takes it

    p.stamped(p.offer_all(), {3})
    pod = p.take_offered_to_evict(key(cpu=300))
    assert pod is not None and pod.sandbox_id == 1  # the longest idle, into checking
    assert 1 in p.checking and 1 not in p.offered
    p.withdrawn(pod)
    admission = p.admit(key(cpu=300), purpose=Purpose.ACQUIRE)
    assert admission.admitted and admission.evicted.sandbox_id == 1
    assert p.live_count == 3  # one offered pod evicted, one create admitted


def test_a_create_for_a_waiting_acquire_is_handed_out_and_a_late_one_becomes_warm():
    clock = FakeClock()
    p = pool(clock)
    waited = p.admit(key(), purpose=Purpose.ACQUIRE).ticket
    assert p.settle(waited, ready=True) is Settle.HAND_OUT
    late = p.admit(key(), purpose=Purpose.ACQUIRE).ticket
    p.abandon(late)
    assert p.settle(late, ready=True) is Settle.WARM
    assert p.creating == {}


def test_a_late_pod_an_agent_has_seen_is_deleted_never_made_warm():
    clock = FakeClock()
    p = pool(clock)
    late = p.admit(key(), purpose=Purpose.ACQUIRE).ticket
    p.abandon(late)
    assert p.settle(late, ready=True, agent_used=True) is Settle.DELETE


def test_a_failed_create_is_deleted_and_leaves_the_books():
    clock = FakeClock()
    p = pool(clock)
    ticket = p.admit(key(), purpose=Purpose.ACQUIRE).ticket
    assert p.live_count == 1
    assert p.settle(ticket, ready=False) is Settle.DELETE
    assert p.live_count == 0


def test_fill_plan_builds_up_to_the_prewarm_target_within_the_cap():
    clock = FakeClock()
    p = pool(clock, max_live=3)
    p.set_target(key(), 5)
    plan = p.fill_plan()
    assert plan == [key()] * 3  # capped by max_live
    for k in plan:
        p.admit(k, purpose=Purpose.WARM)
    assert p.fill_plan() == []  # creating warm builds count toward the target


def test_warm_builds_under_way_count_per_key_until_they_settle_and_acquires_never_count():
    clock = FakeClock()
    p = pool(clock, max_live=100)
    p.set_target(key(), 2)
    p.set_target(key(cpu=100), 1)
    acquiring = p.admit(key(), purpose=Purpose.ACQUIRE).ticket  # not a warm build
    builds = [p.admit(k, purpose=Purpose.WARM).ticket for k in p.fill_plan()]
    assert sorted(t.key.cpu_millis for t in builds if t) == [100, 1000, 1000]
    assert p.fill_plan() == []
    failed = next(t for t in builds if t and t.key == key())
    assert p.settle(failed, ready=False) is Settle.DELETE  # one build of key() failed
    assert p.fill_plan() == [key()]  # ... so one more is planned for it, none for the other
    assert acquiring is not None and p.settle(acquiring, ready=False) is Settle.DELETE
    assert p.fill_plan() == [key()]  # an acquire's create leaving changes no warm count


def test_every_hand_out_of_a_prewarmed_key_asks_for_one_replacement():
    clock = FakeClock()
    p = pool(clock)
    p.set_target(key(), 1)
    warm_up(p, key(), 1, clock)
    assert p.fill_plan() == []
    pod = p.take_warm(key(), "rollout")
    p.hand_out(pod.sandbox_id, pod.key)
    assert p.fill_plan() == [key()]


def test_warm_per_key_applies_to_requested_keys_only():
    clock = FakeClock()
    p = pool(clock, warm_per_key=2)
    assert p.fill_plan() == []
    p.note_request(key())
    assert p.fill_plan() == [key(), key()]


def test_keys_idle_past_the_timeout_are_trimmed_with_their_target():
    clock = FakeClock()
    p = pool(clock, idle_timeout_s=300.0)
    p.set_target(key(cpu=100), 1)
    warm_up(p, key(cpu=100), 1, clock)
    clock.advance(200)
    p.note_request(key(cpu=200))
    warm_up(p, key(cpu=200), 2, clock)
    clock.advance(100)  # key 100 idle 300 s, key 200 idle 100 s
    trimmed = p.trim()
    assert [pod.sandbox_id for pod in trimmed] == [1]
    assert p.warm_for(key(cpu=200)) == 1
    assert key(cpu=100) not in p.targets and p.fill_plan() == []


def test_a_late_warm_pod_of_a_trimmed_key_idles_from_when_it_became_warm():
    clock = FakeClock()
    p = pool(clock, idle_timeout_s=60.0)
    p.add_warm(WarmPod(sandbox_id=9, key=key(), since=clock()))
    clock.advance(59)
    assert p.trim() == []
    clock.advance(1)
    assert [pod.sandbox_id for pod in p.trim()] == [9]


def test_drain_returns_every_warm_pod_and_refuses_new_work():
    clock = FakeClock()
    p = pool(clock)
    p.set_target(key(), 2)
    warm_up(p, key(), 1, clock)
    in_flight = p.admit(key(), purpose=Purpose.ACQUIRE).ticket
    drained = p.drain()
    assert [pod.sandbox_id for pod in drained] == [1]
    assert p.take_warm(key(), "rollout") is None
    assert not p.admit(key(), purpose=Purpose.ACQUIRE).admitted
    assert p.fill_plan() == []
    assert p.settle(in_flight, ready=True) is Settle.DELETE  # settles into a delete


def test_forget_removes_a_sandbox_from_whichever_book_holds_it():
    clock = FakeClock()
    p = pool(clock)
    warm_up(p, key(), 1, clock)
    warm_up(p, key(), 2, clock)
    p.take_warm(key(), "rollout")
    assert p.forget(1) == key()  # from checking
    assert p.forget(2) == key()  # from warm
    assert p.forget(3) is None
    assert p.live_count == 0


def test_reuse_retires_after_no_verdict_max_uses_or_a_contradicting_verdict():
    base = {"patch_sha256": "abc", "suite": "unit", "history": {}, "max_uses": 8}
    ok = reuse_decision(verdict="pass", reuse_count=0, **base)
    assert ok.reuse and ok.verdicts == {"abc:unit": "pass"}
    assert reuse_decision(verdict="none", reuse_count=0, **base).reason == "no_verdict"
    assert reuse_decision(verdict="pass", reuse_count=8, **base).reason == "max_uses"
    flipped = reuse_decision(
        verdict="fail", reuse_count=1, **{**base, "history": {"abc:unit": "pass"}}
    )
    assert not flipped.reuse and flipped.reason == "contradiction"
    other_suite = reuse_decision(
        verdict="fail", reuse_count=1, **{**base, "suite": "e2e", "history": {"abc:unit": "pass"}}
    )
    assert other_suite.reuse
