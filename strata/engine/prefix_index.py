"""A radix tree over token ids: the held conversation sharing the longest prefix with a prompt.

`longest` walks the prompt down the tree, comparing whole edges as list slices, so its
cost grows with the prompt's length (and the branch points on its path), never with
the number of conversations held. Every conversation ends at a node; a node counts the
conversations ending at or below it, and keeps a heap of the idle ones by recency, so
the tie-break (idle first, then the most recently used) is read at the node where the
match ends. Heap entries are dropped lazily: an entry is live while its conversation is
held, idle, has not been used since, and still passes through the node.

The tree changes only through `add`, `remove`, `grew`, `cut` and `touched`; the cache
calls them for every change of a conversation's tokens, activity or recency. A decode
step extends its conversation's own leaf in O(1); a touch pushes one heap entry per node
on the conversation's path; splitting an edge copies the lower node's heap.
"""

from __future__ import annotations

import heapq
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


class _Node:
    __slots__ = ("parent", "edge", "depth", "children", "ends", "count", "recent")

    def __init__(self, parent: _Node | None, edge: list[int], depth: int):
        self.parent = parent
        self.edge = edge  # the tokens from the parent to here (empty only at the root)
        self.depth = depth  # tokens from the root to here
        self.children: dict[int, _Node] = {}  # by the first token of their edge
        self.ends: dict[int, Conversation] = {}  # conversations whose tokens end here
        self.count = 0  # conversations ending here or below
        self.recent: list[tuple[int, int, Conversation]] = []  # heap of (-last_used, id, conv), idle ones


class PrefixIndex:
    def __init__(self) -> None:
        self._root = _Node(None, [], 0)
        self._at: dict[int, _Node] = {}  # conv_id -> the node its tokens end at

    # ---- queries ----------------------------------------------------------------------
    def longest(self, prompt: list[int], active: Iterable[Conversation]) -> tuple[Conversation | None, int]:
        """The held conversation sharing the most leading tokens with `prompt`, and how many.

        Ties go to an idle conversation over an active one, then to the most recent.
        """
        node, pos, n = self._root, 0, len(prompt)
        while pos < n:
            child = node.children.get(prompt[pos])
            if child is None:
                break
            edge = child.edge
            k = common_prefix_len(edge, prompt[pos : pos + len(edge)])
            node, pos = child, pos + k
            if k < len(edge):
                break
        if pos == 0:
            return None, 0
        # every conversation at or below `node` shares exactly `pos` tokens with the prompt
        heap = node.recent
        while heap:
            neg_clock, _, conv = heap[0]
            if self._is_live(conv, -neg_clock, node):
                return conv, pos
            heapq.heappop(heap)
        best = None  # only active conversations are left here (at most one per lane)
        for conv in active:
            if self._passes(conv, node) and (best is None or conv.last_used > best.last_used):
                best = conv
        assert best is not None, "a node with no conversation below it"
        return best, pos

    def other_holder(self, conv: Conversation, depth: int, active: Iterable[Conversation]) -> Conversation | None:
        """Another held conversation whose first `depth` tokens are those of the active `conv`
        (0 < depth <= its length): idle first, most recent first; None when there is none."""
        assert conv.is_active
        x = self._at[conv.conv_id]
        while x.parent.depth >= depth:
            x = x.parent
        if x.count < 2:
            return None
        heap = x.recent
        while heap:
            neg_clock, _, other = heap[0]
            if self._is_live(other, -neg_clock, x):
                return other
            heapq.heappop(heap)
        return max((o for o in active if o is not conv and self._passes(o, x)), key=lambda o: o.last_used, default=None)

    def holds(self, conv: Conversation) -> bool:
        node = self._at.get(conv.conv_id)
        return node is not None and node.ends.get(conv.conv_id) is conv

    # ---- changes ------------------------------------------------------------------------
    def add(self, conv: Conversation) -> None:
        assert conv.conv_id not in self._at
        self._root.count += 1
        node = self._descend(self._root, conv.token_ids)
        node.ends[conv.conv_id] = conv
        self._at[conv.conv_id] = node

    def remove(self, conv: Conversation) -> None:
        node = self._at.pop(conv.conv_id)
        del node.ends[conv.conv_id]
        x = node
        while x is not None:
            x.count -= 1
            x = x.parent
        self._tidy(node)

    def grew(self, conv: Conversation) -> None:
        """`conv.token_ids` was extended (its K/V was written)."""
        node = self._at[conv.conv_id]
        extra = conv.token_ids[node.depth :]
        if not extra:
            return
        if node is not self._root and not node.children and len(node.ends) == 1:
            node.edge.extend(extra)  # its own leaf (a decode step): no one else passes here
            node.depth += len(extra)
            return
        del node.ends[conv.conv_id]
        end = self._descend(node, conv.token_ids)
        end.ends[conv.conv_id] = conv
        self._at[conv.conv_id] = end
        self._tidy(node)
        self.touched(conv)  # (an idle conversation needs its entries on the new nodes)

    def cut(self, conv: Conversation) -> None:
        """`conv.token_ids` was cut back (a branch, an aborted follow-up)."""
        old = self._at[conv.conv_id]
        n = len(conv.token_ids)
        if old.depth == n:
            return
        assert old.depth > n
        del old.ends[conv.conv_id]
        x, below = old, old
        while x.depth > n:
            x.count -= 1
            x, below = x.parent, x
        if x.depth < n:  # the new end falls inside `below`'s edge
            x = self._split(below, n - x.depth)
            x.count += 1
        x.ends[conv.conv_id] = conv
        self._at[conv.conv_id] = x
        self._tidy(old)

    def touched(self, conv: Conversation) -> None:
        """`conv` was used (its `last_used` moved on), or became idle."""
        if conv.is_active:
            return
        entry = (-conv.last_used, conv.conv_id, conv)
        x = self._at[conv.conv_id]
        while x is not self._root:
            heapq.heappush(x.recent, entry)
            if len(x.recent) > 2 * x.count + 8:
                self._compact(x)
            x = x.parent

    # ---- the tree -------------------------------------------------------------------------
    def _descend(self, node: _Node, tokens: list[int]) -> _Node:
        """Walk from `node` along `tokens[node.depth:]`, adding what is missing; every node
        entered below `node` counts one conversation more. Returns the node at the end."""
        pos, n = node.depth, len(tokens)
        while pos < n:
            child = node.children.get(tokens[pos])
            if child is None:
                leaf = _Node(node, tokens[pos:], n)
                leaf.count = 1
                node.children[tokens[pos]] = leaf
                return leaf
            k = common_prefix_len(child.edge, tokens[pos : pos + len(child.edge)])
            if k < len(child.edge):
                child = self._split(child, k)
            child.count += 1
            node, pos = child, pos + k
        return node

    def _split(self, child: _Node, k: int) -> _Node:
        """A new node after the first `k` tokens of `child`'s edge (0 < k < len(edge))."""
        parent = child.parent
        mid = _Node(parent, child.edge[:k], parent.depth + k)
        mid.children[child.edge[k]] = child
        mid.count = child.count
        mid.recent = list(child.recent)  # every conversation below `child` passes `mid`
        parent.children[child.edge[0]] = mid
        child.edge = child.edge[k:]
        child.parent = mid
        return mid

    def _tidy(self, node: _Node) -> None:
        """After a conversation left `node`: drop empty nodes upwards, and merge the first
        remaining one into its only child when no conversation ends there (keeps it compressed)."""
        x = node
        while x is not self._root and x.count == 0:
            del x.parent.children[x.edge[0]]
            x = x.parent
        if x is not self._root and not x.ends and len(x.children) == 1:
            (child,) = x.children.values()
            child.edge = x.edge + child.edge
            child.parent = x.parent
            x.parent.children[x.edge[0]] = child

    def _compact(self, node: _Node) -> None:
        live = {}
        for entry in node.recent:
            conv = entry[2]
            if self._is_live(conv, -entry[0], node):
                live[conv.conv_id] = entry
        node.recent = list(live.values())
        heapq.heapify(node.recent)

    def _passes(self, conv: Conversation, node: _Node) -> bool:
        x = self._at[conv.conv_id]
        while x.depth > node.depth:
            x = x.parent
        return x is node

    def _is_live(self, conv: Conversation, clock: int, node: _Node) -> bool:
        return self.holds(conv) and not conv.is_active and conv.last_used == clock and self._passes(conv, node)

    # ---- checks ---------------------------------------------------------------------------
    def check(self, convs: Iterable[Conversation]) -> None:
        """The tree holds exactly `convs`, each along its own tokens, compressed, counts and
        heaps consistent (tests call it through `Scheduler.check`)."""
        convs = list(convs)
        assert set(self._at) == {c.conv_id for c in convs}, "the index and the cache hold different conversations"
        stack = [self._root]
        while stack:
            x = stack.pop()
            assert x.count == len(x.ends) + sum(c.count for c in x.children.values()), "a node's count"
            if x is not self._root:
                assert x.edge and x.depth == x.parent.depth + len(x.edge) and x.count > 0
                assert x.ends or len(x.children) >= 2, "a node that should have been merged"
            for token, child in x.children.items():
                assert child.parent is x and child.edge[0] == token
                stack.append(child)
        for conv in convs:
            node = self._at[conv.conv_id]
            assert node.ends.get(conv.conv_id) is conv
            path, x = [], node
            while x is not self._root:
                path.append(x)
                x = x.parent
            tokens = [t for x in reversed(path) for t in x.edge]
            assert tokens == conv.token_ids, f"conversation {conv.conv_id}: the index holds stale tokens"
            if not conv.is_active:
                for x in path:
                    assert any(e[2] is conv and -e[0] == conv.last_used for e in x.recent), "a missing heap entry"
