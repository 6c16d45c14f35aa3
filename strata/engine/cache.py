"""The conversation cache: every conversation whose K/V is held, and the LRU order.

It answers two questions: which held conversation shares the longest token prefix
with a new prompt (a radix tree over token ids, `prefix_index`: the cost grows with the
prompt, not with how many conversations are held), and in which order idle
conversations give way.

Every change of a held conversation's tokens, activity or recency goes through here
(`append`, `cut`, `activate`, `deactivate`, `touch`), so the index never goes stale;
`check` compares it with the conversations.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from strata.engine.conversation import Conversation
from strata.engine.prefix_index import PrefixIndex, common_prefix_len

__all__ = ["ConversationCache", "common_prefix_len"]


class ConversationCache:
    def __init__(self) -> None:
        self._conversations: dict[int, Conversation] = {}
        self._active: dict[int, Conversation] = {}  # at most one per lane
        self._index = PrefixIndex()
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
        if conv.is_active:
            self._active[conv.conv_id] = conv
        self._index.add(conv)
        self.touch(conv)

    def remove(self, conv: Conversation) -> None:
        del self._conversations[conv.conv_id]
        self._active.pop(conv.conv_id, None)
        self._index.remove(conv)

    def get(self, conv_id: int) -> Conversation | None:
        return self._conversations.get(conv_id)

    def touch(self, conv: Conversation) -> None:
        self._clock += 1
        conv.last_used = self._clock
        self._index.touched(conv)

    def activate(self, conv: Conversation) -> None:
        """A request extends `conv` from now on (it is used now)."""
        conv.is_active = True
        self._active[conv.conv_id] = conv
        self.touch(conv)

    def deactivate(self, conv: Conversation) -> None:
        """The request extending `conv` is done; it stays cached, idle (used now)."""
        conv.is_active = False
        del self._active[conv.conv_id]
        self.touch(conv)

    def append(self, conv: Conversation, token_ids: Sequence[int]) -> None:
        """`conv` holds the K/V of `token_ids` after its own now: its tokens and its table's cells
        grow together (`len(token_ids) == num_cells` stays true)."""
        conv.token_ids.extend(token_ids)
        conv.table.append_cells(len(token_ids))
        self._index.grew(conv)

    def cut(self, conv: Conversation, num_cells: int) -> None:
        """`conv` forgets its tokens (and checkpoints) past `num_cells`."""
        conv.cut(num_cells)
        self._index.cut(conv)

    def longest_prefix(self, token_ids: list[int]) -> tuple[Conversation | None, int]:
        """The held conversation sharing the most leading tokens with `token_ids`.

        Ties go to an idle conversation over an active one, then to the most recent.
        """
        return self._index.longest(token_ids, self._active.values())

    def other_holder(self, conv: Conversation, num_tokens: int) -> Conversation | None:
        """Another held conversation starting with the first `num_tokens` tokens of the active `conv`."""
        return self._index.other_holder(conv, num_tokens, self._active.values())

    def idle_lru(self, exclude: Iterable[Conversation] = ()) -> list[Conversation]:
        """Idle conversations, least recently used first: the order they give way in."""
        skip = {c.conv_id for c in exclude}
        idle = [c for c in self._conversations.values() if not c.is_active and c.conv_id not in skip]
        return sorted(idle, key=lambda c: c.last_used)

    def check(self) -> None:
        """The index agrees with the conversations (tests also compare its answers with a
        brute-force scan: tests/checks.py)."""
        assert self._active == {c.conv_id: c for c in self if c.is_active}, "the active set is stale"
        self._index.check(self)
