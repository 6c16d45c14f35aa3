"""The n-gram drafter (prompt lookup): propose what followed the last occurrence of the
conversation's last n tokens, for n from `max_n` down to `min_n`.

`NgramIndex` keeps, for every n-gram of the token stream (n <= max_n), where its last two
occurrences end, updated in O(max_n) per appended token: a lookup of the stream's own
suffix finds its previous occurrence without scanning. No torch here.
"""

from __future__ import annotations

from collections.abc import Iterable

# Longer matches first: a suffix of 8 tokens that occurred before predicts what follows it
# better than one of 2 (benchmarks/spec.py's repeat workload keeps more of such drafts).
DEFAULT_MAX_N = 8
DEFAULT_MIN_N = 2


class NgramIndex:
    def __init__(self, max_n: int = DEFAULT_MAX_N, min_n: int = DEFAULT_MIN_N):
        assert 1 <= min_n <= max_n
        self.max_n, self.min_n = max_n, min_n
        self.tokens: list[int] = []
        # n-gram -> (end of its last occurrence, end of the one before, or -1); an end is the
        # index of the n-gram's last token
        self._ends: dict[tuple[int, ...], tuple[int, int]] = {}

    def __len__(self) -> int:
        return len(self.tokens)

    def extend(self, tokens: Iterable[int]) -> None:
        for t in tokens:
            self.tokens.append(t)
            end = len(self.tokens) - 1
            for n in range(1, min(self.max_n, end + 1) + 1):
                key = tuple(self.tokens[end - n + 1 : end + 1])
                last = self._ends.get(key)
                self._ends[key] = (end, last[0] if last is not None else -1)

    def truncate(self, num_tokens: int) -> None:
        """Forget tokens past `num_tokens` (rebuilds: rare, a branch)."""
        if num_tokens < len(self.tokens):
            kept = self.tokens[:num_tokens]
            self.tokens, self._ends = [], {}
            self.extend(kept)

    def propose(self, k: int, next_token: int) -> list[int]:
        """Up to `k` tokens that followed the latest earlier occurrence of the longest suffix
        (of `min_n`..`max_n` tokens) of the stream plus `next_token` (not added); [] when none."""
        tokens = self.tokens
        end = len(tokens)  # the position next_token would take
        if k <= 0 or end < 1:
            return []
        for n in range(min(self.max_n, end + 1), self.min_n - 1, -1):
            found = self._ends.get((*tokens[end - n + 1 :], next_token))
            if found is None:
                continue
            start = found[0] + 1  # an occurrence within the stream: before next_token's position
            stream = tokens[start : start + k]
            if len(stream) < k and start + len(stream) == end:
                stream.append(next_token)
            return stream[:k]
        return []
