"""Content addressing of token prefixes: chained hashes of fixed blocks of token ids.

Block b's key hashes block b's tokens together with block b-1's key, so a key names the
whole prefix up to its block's end: two token lists share their first n keys exactly
when they share their first n * block tokens (up to 64-bit collisions). A replica
reports the keys of every conversation it holds (running, idle in a lane, or parked); the
router walks a request's keys and counts how many a replica holds, which is how many
blocks of the request's prompt that replica can reuse. The same exact-prefix notion the
engine's own prefix index uses, quantised to blocks so that it travels as a set of ints.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence, Set as AbstractSet
from dataclasses import dataclass, field

DEFAULT_ROUTE_BLOCK = 32  # tokens per key: a follow-up turn matches all but its last < 32 tokens
_SEED = b"strata-prefix-v1"


def prefix_keys(token_ids: Sequence[int], block: int, start: int = 0, prev: int | None = None) -> list[int]:
    """Keys of the full blocks of `token_ids` from block `start` on; `prev` is block
    start-1's key (None at the first block)."""
    keys = []
    for b in range(start, len(token_ids) // block):
        h = hashlib.blake2b(digest_size=8, key=_SEED)
        h.update(prev.to_bytes(8, "little", signed=True) if prev is not None else b"")
        h.update(b"".join(t.to_bytes(4, "little") for t in token_ids[b * block : (b + 1) * block]))
        prev = int.from_bytes(h.digest(), "little", signed=True)
        keys.append(prev)
    return keys


def matched_tokens(request_keys: Sequence[int], block: int, *held: AbstractSet[int]) -> int:
    """Tokens of the request's prompt a holder of the `held` sets can reuse: its leading
    keys found in any of them."""
    n = 0
    for k in request_keys:
        if not any(k in h for h in held):
            break
        n += 1
    return n * block


@dataclass
class KeyCache:
    """Keys per held conversation, extended as it grows (a conversation's first tokens never
    change while it is held: a cut or a new id drops its entry)."""

    block: int
    _by_conv: dict[int, tuple[list[int], list[int]]] = field(default_factory=dict)  # id -> (tokens seen, keys)

    def keys(self, convs: Iterable[tuple[int, list[int]]]) -> set[int]:
        """Every key of the conversations `(conv_id, token_ids)`; entries of others are dropped."""
        out: set[int] = set()
        seen = {}
        for conv_id, tokens in convs:
            old = self._by_conv.get(conv_id)
            n_full = len(tokens) // self.block
            if old is not None and len(old[1]) <= n_full and tokens[: len(old[1]) * self.block] == old[0]:
                keys = old[1] + prefix_keys(tokens, self.block, len(old[1]), old[1][-1] if old[1] else None)
            else:
                keys = prefix_keys(tokens, self.block)
            seen[conv_id] = (list(tokens[: n_full * self.block]), keys)
            out.update(keys)
        self._by_conv = seen
        return out
