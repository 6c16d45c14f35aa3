"""The conversation cache: every conversation whose K/V is held, and the LRU order.

It answers two questions: which held conversation shares the longest token prefix
with a new prompt, and in which order idle conversations give way.
"""

from __future__ import annotations

from collections.abc import Iterable

from strata.engine.conversation import Conversation


def common_prefix_len(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix (slice compares run in C, then a binary search)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


class ConversationCache:
    def __init__(self) -> None:
        self._conversations: dict[int, Conversation] = {}
        self._next_id = 0
        self._clock = 0

    def __len__(self) -> int:
        return len(self._conversations)

    def __iter__(self):
        return iter(self._conversations.values())

    def new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    def add(self, conv: Conversation) -> None:
        assert conv.conv_id not in self._conversations
        self._conversations[conv.conv_id] = conv
        self.touch(conv)

    def remove(self, conv: Conversation) -> None:
        del self._conversations[conv.conv_id]

    def get(self, conv_id: int) -> Conversation | None:
        return self._conversations.get(conv_id)

    def touch(self, conv: Conversation) -> None:
        self._clock += 1
        conv.last_used = self._clock

    def longest_prefix(self, token_ids: list[int]) -> tuple[Conversation | None, int]:
        """The held conversation sharing the most leading tokens with `token_ids`.

        Ties go to an idle conversation over an active one, then to the most recent.
        """
        best, best_len = None, 0
        for conv in self._conversations.values():
            n = common_prefix_len(conv.token_ids, token_ids)
            if n == 0:
                continue
            key = (n, not conv.is_active, conv.last_used)
            if best is None or key > (best_len, not best.is_active, best.last_used):
                best, best_len = conv, n
        return best, best_len

    def idle_lru(self, exclude: Iterable[Conversation] = ()) -> list[Conversation]:
        """Idle conversations, least recently used first: the order they give way in."""
        skip = {c.conv_id for c in exclude}
        idle = [c for c in self._conversations.values() if not c.is_active and c.conv_id not in skip]
        return sorted(idle, key=lambda c: c.last_used)
