"""Prefix keys (cluster/keys.py): two token lists share their first n keys exactly when
they share their first n blocks; a KeyCache extended turn by turn equals a fresh one."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from strata.cluster.keys import KeyCache, matched_tokens, prefix_keys

tokens_st = st.lists(st.integers(0, 5), max_size=40)  # a small alphabet: many shared prefixes


@given(a=tokens_st, b=tokens_st, block=st.integers(1, 6))
def test_shared_keys_are_shared_blocks(a, b, block):
    ka, kb = prefix_keys(a, block), prefix_keys(b, block)
    assert len(ka) == len(a) // block
    common = 0
    while common < min(len(a), len(b)) and a[common] == b[common]:
        common += 1
    assert matched_tokens(kb, block, set(ka)) == (common // block) * block


@given(a=st.lists(st.integers(0, 5), min_size=1, max_size=40), block=st.integers(1, 6), data=st.data())
def test_keys_resumed_from_any_block_are_the_rest_of_the_keys(a, block, data):
    """`prefix_keys(a, block, start, key of block start-1)` is every key from block `start` on
    (what KeyCache does as a conversation grows), for every start, 0 (no previous key) included."""
    ka = prefix_keys(a, block)
    start = data.draw(st.integers(0, len(ka)), label="start")
    assert prefix_keys(a, block, start, ka[start - 1] if start else None) == ka[start:]


@given(turns=st.lists(st.tuples(st.integers(0, 3), tokens_st), max_size=12), block=st.integers(1, 6))
def test_a_key_cache_follows_conversations_as_a_fresh_one(turns, block):
    """Each turn: conversation `i` grows by some tokens, or (on an empty addition) is cut."""
    convs: dict[int, list[int]] = {}
    cache = KeyCache(block)
    for conv_id, added in turns:
        tokens = convs.setdefault(conv_id, [])
        if added:
            tokens += added
        else:
            del tokens[len(tokens) // 2 :]
        held = cache.keys(list(convs.items()))
        assert held == {k for t in convs.values() for k in prefix_keys(t, block)}
