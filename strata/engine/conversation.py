"""The scheduler's state objects: conversations, lanes and running sequences (no tensors)."""

from __future__ import annotations

from dataclasses import dataclass, field

from typing import TYPE_CHECKING

from strata.kv.table import ChunkTable

if TYPE_CHECKING:
    from strata.drafting.planner import LaneSpec


@dataclass(eq=False)
class Conversation:
    """Token history + chunk table + checkpoints.

    Invariant: `len(token_ids) == table.num_cells`: every listed token has its K/V
    in the table (a sampled token not yet fed is held by the sequence, not here).
    """

    conv_id: int
    table: ChunkTable
    token_ids: list[int] = field(default_factory=list)
    checkpoints: list[int] = field(default_factory=list)  # turn starts, ascending
    lane: int | None = None  # the lane it sits in; None when parked without a lane
    last_used: int = 0  # logical clock: the LRU order of the conversation cache
    is_active: bool = False  # a request is extending it now
    # --spec draft: leading cells whose draft-model K/V is written (that model's layers of the
    # same chunks); the drafter feeds the rest before it proposes
    draft_cells: int = 0

    @property
    def num_cells(self) -> int:
        return self.table.num_cells

    def add_checkpoint(self, position: int) -> None:
        if not self.checkpoints or self.checkpoints[-1] < position:
            self.checkpoints.append(position)

    def cut(self, num_cells: int) -> None:
        """Forget tokens and checkpoints past `num_cells` (the table was truncated)."""
        del self.token_ids[num_cells:]
        self.draft_cells = min(self.draft_cells, num_cells)
        self.checkpoints = [c for c in self.checkpoints if c <= num_cells]


@dataclass(eq=False)
class Sequence:
    """A request while it holds a lane: the prompt, and how far its K/V has got."""

    request_id: str
    prompt_ids: list[int]
    order: int  # admission order: the largest is the youngest
    lane: int
    conv: Conversation
    num_cached: int  # prompt tokens whose K/V were reused, not computed
    is_extension: bool = False  # it took over a cached conversation (which predates it)
    pending: int | None = None  # the last sampled token; its K/V is computed next step
    num_output: int = 0
    target_cells: int = 0  # prompt + the most new tokens it may take (0: unknown)
    spec: LaneSpec | None = None  # --spec: its n-gram index, adaptive k and planned drafts

    @property
    def num_prompt_left(self) -> int:
        return len(self.prompt_ids) - self.conv.num_cells

    @property
    def is_prefilling(self) -> bool:
        return self.num_prompt_left > 0


@dataclass(eq=False)
class Lane:
    """A place where a conversation is decoded: lane 0 is the main session."""

    index: int
    conv: Conversation | None = None  # an idle (parked-in-lane) or active conversation
    seq: Sequence | None = None  # the request being served, if any
    # The session file in flight that holds this lane (engine/holds.py): a restore into it, or,
    # where conversations live in their lane's reservation, the save of its conversation. No
    # request is placed in a pinned lane until the session file is done.
    pinned_by: int | None = None

    @property
    def is_pinned(self) -> bool:
        return self.pinned_by is not None

    @property
    def is_empty(self) -> bool:
        return self.conv is None

    @property
    def is_idle(self) -> bool:
        return self.conv is not None and self.seq is None

    @property
    def is_busy(self) -> bool:
        return self.seq is not None
