"""Page residency (`--kv-evict clock|lrfu`) on traces whose answers are worked out by hand.

Pages are small integers; a lane's reads are every page of its conversation, each step.
"""

from __future__ import annotations

import pytest

from strata.kv.residency import LaneReads, LRFUPolicy, Residency

POLICIES = ("clock", "lrfu")


def step(r: Residency, *lanes: tuple[int, int, tuple[int, ...]]):
    plan = r.plan([LaneReads(lane, ring, pages) for lane, ring, pages in lanes])
    r.check()
    return plan


@pytest.mark.parametrize("policy", POLICIES)
def test_cyclic_scan_larger_than_the_ring_keeps_what_fits(policy):
    """5 pages, ring of 3: step 1 admits 0, 1, 2 and streams 3, 4; every later step reads
    0, 1, 2 in place and streams 3, 4 again. (LRU admitting every streamed page would evict
    0 for 3, 1 for 4, then 2 for 0 ...: every read a miss.)"""
    r = Residency(3, policy)
    first = step(r, (0, 3, (0, 1, 2, 3, 4)))
    assert first.admitted == ((0, 0), (1, 1), (2, 2)) and first.streamed == (3, 4) and first.evicted == ()
    for _ in range(20):
        p = step(r, (0, 3, (0, 1, 2, 3, 4)))
        assert p.admitted == () and p.evicted == () and p.streamed == (3, 4)
        assert p.slot_of == {0: 0, 1: 1, 2: 2}
        assert p.lanes[0].resident == 3 and p.lanes[0].streamed == 2


@pytest.mark.parametrize("policy", POLICIES)
def test_a_growing_conversation_fills_its_ring_then_streams_the_rest(policy):
    r = Residency(4, policy)
    seen = []
    for n in range(1, 7):  # the conversation reaches one more page each step
        p = step(r, (0, 3, tuple(range(n))))
        seen.append((p.admitted, p.streamed))
    assert seen == [
        (((0, 0),), ()),
        (((1, 1),), ()),
        (((2, 2),), ()),
        ((), (3,)),  # its ring is 3 pages: the 4th streams although a slot is free
        ((), (3, 4)),
        ((), (3, 4, 5)),
    ]


@pytest.mark.parametrize("policy", POLICIES)
def test_a_shared_system_prompt_is_resident_once_and_stays(policy):
    """Pages 0, 1 are a system prompt every lane reads; lanes A, B, C add 10, 20, 30 and
    grow. The arena (5 slots) holds the prompt once and each lane's own page; when lane C
    comes (no free slot is left for its page 30 after A and B took 10, 11, 20) its page
    streams: the shared pages, read every step, are never displaced."""
    r = Residency(5, policy)
    p = step(r, (0, 3, (0, 1, 10)), (1, 3, (0, 1, 20)))
    assert p.admitted == ((0, 0), (1, 1), (10, 2), (20, 3))
    p = step(r, (0, 3, (0, 1, 10, 11)), (1, 3, (0, 1, 20)), (2, 3, (0, 1, 30)))
    # A's ring (3) is full with 0, 1, 10: 11 streams; C's 30 takes the last free slot
    assert p.admitted == ((30, 4),) and p.streamed == (11,)
    for _ in range(5):
        p = step(r, (0, 3, (0, 1, 10, 11)), (1, 3, (0, 1, 20, 21)), (2, 3, (0, 1, 30, 31)))
        assert p.slot_of[0] == 0 and p.slot_of[1] == 1 and p.evicted == ()
        assert set(p.streamed) == {11, 21, 31}
    assert r.num_resident == 5


def test_clock_gives_a_parked_conversations_pages_a_second_chance():
    """Lane 0 read 0..3 (4 slots full), then parks. Lane 1 (ring 2) reads 7, 8: the hand
    clears 0..3's bits on its first lap and takes slot 0 on the second; the next page takes
    slot 1 (its bit is clear now)."""
    r = Residency(4, "clock")
    step(r, (0, 4, (0, 1, 2, 3)))
    p = step(r, (1, 2, (7, 8)))
    assert p.admitted == ((7, 0), (8, 1)) and p.evicted == (0, 1)
    p = step(r, (1, 2, (7, 8, 9)))  # ring 2 is full: 9 streams, 2 and 3 stay
    assert p.streamed == (9,) and p.evicted == () and r.slot_of == {7: 0, 8: 1, 2: 2, 3: 3}


def test_lrfu_keeps_the_frequently_read_page_of_a_finished_conversation():
    """Pages 0 (read by 3 lanes for 10 steps: a system prompt) and 5, 6 (one lane, once) fill
    3 slots; those lanes finish. A new lane reading 9: LRFU's victim is the least valuable
    page, 5 or 6 (read once), never 0; CLOCK's hand takes slot 0 (page 0) since every bit
    was cleared on its first lap."""
    results = {}
    for policy in POLICIES:
        r = Residency(3, policy)
        for _ in range(10):
            step(r, (0, 1, (0,)), (1, 1, (0,)), (2, 1, (0,)))
        step(r, (3, 2, (5, 6)))
        p = step(r, (4, 1, (9,)))
        results[policy] = (p.evicted, 0 in r.slot_of)
    assert results["lrfu"] == ((5,), True)
    assert results["clock"] == ((0,), False)


def test_lrfu_refuses_to_displace_a_more_valuable_page():
    """A page read once may not displace one read by 3 lanes a step ago (CRF 3 x 2^-0.1 ~ 2.8):
    it streams; after enough steps of reads of its own its CRF passes the idle page's and it
    takes the slot."""
    r = Residency(1, "lrfu")
    step(r, (0, 1, (0,)), (1, 1, (0,)), (2, 1, (0,)))
    p = step(r, (3, 1, (9,)))
    assert p.streamed == (9,) and p.admitted == ()
    steps = 1
    while 9 not in r.slot_of:
        step(r, (3, 1, (9,)))
        steps += 1
    # by hand: page 0's value 3 * 2^(-0.1 t) against page 9's (1 - 2^(-0.1 k)) / (1 - 2^-0.1) after k reads
    assert steps == 3
    assert r.policy.value(9, r.now) > 0 and 0 not in r.slot_of


def test_lrfu_value_by_hand():
    pol = LRFUPolicy(4, lam=1.0)
    pol.read(7, None, 1)
    pol.read(7, None, 1)  # two lanes in one step: 2
    pol.read(7, None, 3)  # two steps later: 1 + 2 * 2^-2 = 1.5
    assert pol.value(7, 3) == pytest.approx(1.5)
    assert pol.value(7, 4) == pytest.approx(0.75)


@pytest.mark.parametrize("policy", POLICIES)
def test_invalidated_pages_leave_and_are_admitted_again(policy):
    r = Residency(3, policy)
    step(r, (0, 3, (0, 1, 2)))
    assert r.invalidate([1, 7]) == 1
    p = step(r, (0, 3, (0, 1, 2)))
    assert p.admitted == ((1, 1),) and p.lanes[0].resident == 2


@pytest.mark.parametrize("policy", POLICIES)
def test_a_page_read_by_two_lanes_is_staged_once(policy):
    r = Residency(1, policy)
    step(r, (0, 1, (5,)))
    p = step(r, (0, 1, (5, 6)), (1, 1, (6, 7)))
    # lane 1 has room in its ring (0 of 1 used) but the only slot holds 5, pinned by lane 0
    assert p.streamed == (6, 7) and p.lanes[1].streamed == 2 and p.lanes[0].streamed == 1
