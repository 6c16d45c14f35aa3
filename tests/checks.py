"""Checks and reference algorithms the tests hold the engine to (never imported by strata).

- `check_scheduler`: every invariant `Scheduler.check` verifies, and the conversation
  cache's prefix index against a brute-force scan for prompts built from every held
  conversation (its tokens, one more token, half of them, all but the last);
- `scan_longest_prefix`: that brute-force scan (the algorithm the index replaced);
- `scan_propose`: the n-gram drafter's answer by a scan (the reference `NgramIndex` meets).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from strata.drafting.ngram import DEFAULT_MAX_N, DEFAULT_MIN_N
from strata.engine.cache import ConversationCache
from strata.engine.conversation import Conversation
from strata.engine.prefix_index import common_prefix_len
from strata.engine.scheduler import Scheduler


def scan_longest_prefix(convs: Iterable[Conversation], token_ids: list[int]) -> tuple[Conversation | None, int]:
    """The brute-force answer to `ConversationCache.longest_prefix` (every conversation, token
    by token; ties: idle over active, then the most recently used)."""
    best, best_len = None, 0
    for conv in convs:
        n = common_prefix_len(conv.token_ids, token_ids)
        if n == 0:
            continue
        key = (n, not conv.is_active, conv.last_used)
        if best is None or key > (best_len, not best.is_active, best.last_used):
            best, best_len = conv, n
    return best, best_len


def check_cache(cache: ConversationCache) -> None:
    """`cache.check()`, and its prefix lookups against the scan for probes from every conversation."""
    cache.check()
    probes = []
    for conv in cache:
        t = conv.token_ids
        probes += [t, t + [-1], t[: len(t) // 2], t[:-1]]
    for p in probes:
        best, n = cache.longest_prefix(p)
        ref, ref_n = scan_longest_prefix(cache, p)
        assert (best, n) == (ref, ref_n), (p, best and best.conv_id, n, ref and ref.conv_id, ref_n)


def check_scheduler(scheduler: Scheduler) -> None:
    scheduler.check()
    check_cache(scheduler.cache)


def scan_propose(tokens: Sequence[int], k: int, max_n: int = DEFAULT_MAX_N, min_n: int = DEFAULT_MIN_N) -> list[int]:
    """What `NgramIndex.propose(k, tokens[-1])` over `tokens[:-1]` gives, by a scan."""
    end = len(tokens) - 1
    if k <= 0 or end < 1:
        return []
    for n in range(min(max_n, end + 1), min_n - 1, -1):
        suffix = list(tokens[end - n + 1 :])
        for e in range(end - 1, n - 2, -1):
            if list(tokens[e - n + 1 : e + 1]) == suffix:
                return list(tokens[e + 1 : min(e + 1 + k, end + 1)])
    return []
