"""The n-gram drafter's index and the adaptive k (drafting/), without a model."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from strata.drafting.adaptive import PROBE_EVERY, AdaptiveK
from strata.drafting.ngram import NgramIndex
from tests.checks import scan_propose


@settings(max_examples=300, deadline=None)
@given(tokens=st.lists(st.integers(0, 3), min_size=1, max_size=40), k=st.integers(0, 6),
       split=st.integers(0, 40))
def test_index_equals_the_scan(tokens, k, split):
    """Built in two pieces (as a conversation grows), the index proposes what a scan finds."""
    index = NgramIndex()
    body = tokens[:-1]
    index.extend(body[:split])
    index.extend(body[split:])
    assert index.propose(k, tokens[-1]) == scan_propose(tokens, k)


def test_proposals_by_hand():
    index = NgramIndex(max_n=3, min_n=2)
    index.extend([5, 6, 7, 8, 9, 5, 6])
    assert index.propose(3, 7) == [8, 9, 5]  # "5 6 7" was followed by 8 9 5
    assert index.propose(3, 1) == []  # "6 1" never occurred
    index.extend([7, 1, 2, 6, 7, 3])
    # "6 7" last occurred at 7..8 (followed by 1 2); the longer "3 6 7" never did
    assert index.propose(2, 6) == []  # suffix "3 6": unseen
    index.extend([6])
    assert index.propose(2, 7) == [3, 6]  # "6 7" latest earlier occurrence: positions 11-12, then 3 6
    index.truncate(5)
    assert index.tokens == [5, 6, 7, 8, 9] and index.propose(2, 5) == []


def test_k_reaches_zero_when_drafts_are_rejected_and_probes_later():
    a = AdaptiveK(max_k=4)
    assert a.k() > 0
    steps = 0
    while a.k() > 0:
        a.record(a.k(), 0)
        steps += 1
        assert steps < 20
    for _ in range(PROBE_EVERY - 1):
        a.record(0, 0)
        assert a.k() == 0
    a.record(0, 0)
    assert a.k() == 1  # a probe
    rejected = a.num_drafted
    for _ in range(10):
        a.record(a.k(), a.k())  # everything kept: back to the most drafts
    assert a.k() == 4 and a.num_drafted - rejected == a.num_accepted > 0


def test_k_follows_acceptance():
    high, low = AdaptiveK(max_k=6), AdaptiveK(max_k=6)
    for _ in range(30):
        high.record(4, 4)
        low.record(4, 1)
    assert high.k() == 6 and 0 < low.k() < high.k()
