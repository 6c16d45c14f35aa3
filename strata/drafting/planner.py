"""Plans each decoding lane's drafts for a step, and records what the verify step kept.

Two planners, one per drafter:
- `NgramPlanner` (`--spec ngram`): proposes at plan time from the lane's own tokens (prompt
  lookup, drafting/ngram.py); the lane's work carries the drafts in its token ids.
- `ModelPlanner` (`--spec draft`): reserves room for up to k drafts and names the lane's
  draft slots; the runner's draft model proposes them (drafting/draft_model.py).

Drafts are optional work: they are planned after the step's admissions, take room only
from free chunks (never evicting a parked conversation), never carry a request past its
`max_tokens` or `--max-context`, and never take a step past `max_step_rows` rows (the rows a
decode step may have before its projections leave their cheap path: every lane would pay).
A rejected draft's cells are given back at commit through the chunk table. No torch here.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from strata.drafting.adaptive import AdaptiveK
from strata.drafting.ngram import NgramIndex
from strata.kv.layout import KVLayout
from strata.kv.table import ChunkTable
from strata.step import DraftOutcome, LaneDrafts, LaneWork


@dataclass
class SpecCounters:
    num_steps: int = 0  # verify steps (a lane with drafts)
    num_drafted: int = 0
    num_accepted: int = 0


@dataclass
class LaneSpec:
    """A sequence's drafting state: its adaptive k, the drafter's own state, the step's drafts."""

    k: AdaptiveK
    index: NgramIndex | None = None  # the n-gram drafter's index of the conversation's tokens
    drafts: tuple[int, ...] = ()  # planned for the step being run
    draft_slots: int = 0  # --spec draft: drafts the runner's draft model may propose this step
    counters: SpecCounters = field(default_factory=SpecCounters)


class DraftedConversation(Protocol):
    """What a planner reads of a held conversation (the scheduler's `Conversation`)."""

    table: ChunkTable
    token_ids: list[int]
    draft_cells: int  # --spec draft: leading cells whose draft-model K/V is written

    @property
    def num_cells(self) -> int: ...


class DecodingSequence(Protocol):
    """What a planner reads and sets of a running request (the scheduler's `Sequence`)."""

    request_id: str
    order: int
    pending: int | None
    target_cells: int
    spec: LaneSpec | None

    @property
    def conv(self) -> DraftedConversation: ...

    @property
    def is_prefilling(self) -> bool: ...


class Drafter(Protocol):
    def propose(self, seq: DecodingSequence, k: int) -> list[int]:
        """Up to `k` tokens to follow `seq`'s conversation and its pending token."""


class NgramDrafter:
    """Prompt lookup (drafting/ngram.py) over the conversation: prompt and output."""

    def propose(self, seq: DecodingSequence, k: int) -> list[int]:
        conv = seq.conv
        if seq.spec.index is None:
            seq.spec.index = NgramIndex()
        index = seq.spec.index
        if len(index) > conv.num_cells:  # the conversation was cut back (a branch)
            index.truncate(conv.num_cells)
        index.extend(conv.token_ids[len(index) :])
        return index.propose(k, seq.pending)  # the pending token is not the conversation's yet


class DraftPlanner(ABC):
    def __init__(self, max_k: int, layout: KVLayout, max_context: int, max_step_rows: int | None = None):
        assert max_k >= 1
        self.max_k = max_k
        self.layout = layout
        self.max_context = max_context
        self.max_step_rows = max_step_rows  # None: no limit
        self.counters = SpecCounters()

    def state(self, seq: DecodingSequence) -> LaneSpec:
        if seq.spec is None:
            seq.spec = LaneSpec(AdaptiveK(self.max_k))
        return seq.spec

    def plan(self, seqs: Iterable[DecodingSequence]) -> None:
        """Sets the drafts of every decoding sequence (oldest first) and grows its table for them."""
        decoding = [s for s in sorted(seqs, key=lambda s: s.order) if not s.is_prefilling and s.pending is not None]
        budget = self.max_context if self.max_step_rows is None else self.max_step_rows - len(decoding)
        for seq in decoding:
            spec = self.state(seq)
            spec.drafts, spec.draft_slots = (), 0
            conv = seq.conv
            k = min(spec.k.k(), self.max_context - conv.num_cells - 1, budget)
            if seq.target_cells:
                k = min(k, seq.target_cells - conv.num_cells - 2)  # the last token it may emit is its own
            if k > 0:
                budget -= self._plan_lane(seq, spec, k)

    def _room(self, conv: DraftedConversation, k: int) -> int:
        """The most of `k` drafts the free chunks can hold after the conversation's pending token."""
        while k and self.layout.num_chunks_to_grow(conv.table, conv.num_cells + 1 + k) > self.layout.pool.num_free:
            k -= 1
        return k

    @abstractmethod
    def _plan_lane(self, seq: DecodingSequence, spec: LaneSpec, k: int) -> int:
        """Plans up to `k` drafts for `seq` and grows its table for them; returns how many."""

    @abstractmethod
    def lane_drafts(self, seq: DecodingSequence) -> tuple[tuple[int, ...], LaneDrafts | None]:
        """A decoding sequence's tokens for this step (its pending token, then any drafts) and
        the drafting record its work carries."""

    def record(self, seqs: Mapping[str, DecodingSequence], outcomes: Iterable[DraftOutcome],
               work: Iterable[LaneWork]) -> None:
        """The verify step's outcomes, into each lane's adaptive k and the counters."""
        by_id = {o.request_id: o for o in outcomes}
        for w in work:
            seq = seqs.get(w.request_id)
            if seq is None or seq.spec is None or w.prompt:
                continue  # not a decode step (a prompt piece)
            o = by_id.get(w.request_id)
            drafted, accepted = (o.num_drafted, o.num_accepted) if o is not None else (0, 0)
            seq.spec.k.record(drafted, accepted)
            seq.spec.drafts, seq.spec.draft_slots = (), 0
            if drafted:
                for c in (seq.spec.counters, self.counters):
                    c.num_steps += 1
                    c.num_drafted += drafted
                    c.num_accepted += accepted


class NgramPlanner(DraftPlanner):
    def __init__(self, max_k: int, layout: KVLayout, max_context: int, max_step_rows: int | None = None,
                 drafter: Drafter | None = None):
        super().__init__(max_k, layout, max_context, max_step_rows)
        self.drafter = drafter if drafter is not None else NgramDrafter()

    def _plan_lane(self, seq: DecodingSequence, spec: LaneSpec, k: int) -> int:
        drafts = self.drafter.propose(seq, k)[:k]
        n = self._room(seq.conv, len(drafts))
        if n:
            self.layout.grow(seq.conv.table, seq.conv.num_cells + 1 + n)
            spec.drafts = tuple(drafts[:n])
        return n

    def lane_drafts(self, seq: DecodingSequence) -> tuple[tuple[int, ...], LaneDrafts | None]:
        drafts = seq.spec.drafts if seq.spec is not None else ()
        return (seq.pending, *drafts), LaneDrafts(num_drafts=len(drafts)) if drafts else None


class ModelPlanner(DraftPlanner):
    def _plan_lane(self, seq: DecodingSequence, spec: LaneSpec, k: int) -> int:
        n = self._room(seq.conv, k)
        if n:
            self.layout.grow(seq.conv.table, seq.conv.num_cells + 1 + n)
            spec.draft_slots = n
        return n

    def lane_drafts(self, seq: DecodingSequence) -> tuple[tuple[int, ...], LaneDrafts | None]:
        slots = seq.spec.draft_slots if seq.spec is not None else 0
        if not slots:
            return (seq.pending,), None
        conv = seq.conv
        return (seq.pending,), LaneDrafts(slots=slots, feed=(*conv.token_ids[conv.draft_cells :], seq.pending),
                                          feed_start=conv.draft_cells)


def kept_tokens(w: LaneWork, outcome: DraftOutcome | None) -> tuple[int, ...]:
    """What a verify step's lane keeps: its fed token and the accepted drafts."""
    drafts = w.token_ids[1:] if w.num_drafts else (outcome.tokens if outcome is not None else ())
    accepted = outcome.num_accepted if outcome is not None else 0
    return (w.token_ids[0], *drafts[:accepted])


def draft_cells_after(w: LaneWork, outcome: DraftOutcome | None) -> int | None:
    """--spec draft: the conversation's cells whose draft-model K/V is written after the step
    (the fed token and the drafts the draft model was fed: all but its last proposal, of the
    kept ones); None when the lane had no draft slots."""
    if not w.draft_slots:
        return None
    drafts = outcome.tokens if outcome is not None else ()
    accepted = outcome.num_accepted if outcome is not None else 0
    return w.start + 1 + min(accepted, max(0, len(drafts) - 1))
