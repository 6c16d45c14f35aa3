"""Plans each decoding lane's drafts for a step, and records what the verify step kept.

Drafts are optional work: they are planned after the step's admissions, take room only
from free chunks (never evicting a parked conversation), and never carry a request past
its `max_tokens` or `--max-context`. A rejected draft's cells are given back at commit
through the chunk table (`commit_drafts`), so nothing else ever sees them. No torch here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from strata.engine.cache import ConversationCache
from strata.engine.conversation import Sequence
from strata.engine.spec.adaptive import AdaptiveK
from strata.engine.spec.ngram import NgramIndex
from strata.kv.layout import KVLayout
from strata.step import DraftOutcome, LaneWork


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


class Drafter(Protocol):
    def propose(self, seq: Sequence, k: int) -> list[int]:
        """Up to `k` tokens to follow `seq`'s conversation and its pending token."""


class NgramDrafter:
    """Prompt lookup (engine/spec/ngram.py) over the conversation: prompt and output."""

    def propose(self, seq: Sequence, k: int) -> list[int]:
        conv = seq.conv
        if seq.spec.index is None:
            seq.spec.index = NgramIndex()
        index = seq.spec.index
        if len(index) > conv.num_cells:  # the conversation was cut back (a branch)
            index.truncate(conv.num_cells)
        index.extend(conv.token_ids[len(index) :])
        return index.propose(k, seq.pending)  # the pending token is not the conversation's yet


class DraftPlanner:
    """`by_model`: the runner's draft model proposes (the plan reserves room for up to k drafts
    and names the lane's draft slots); else `drafter` proposes here, at plan time."""

    def __init__(self, max_k: int, layout: KVLayout, max_context: int, drafter: Drafter | None = None,
                 by_model: bool = False):
        assert max_k >= 1
        self.max_k = max_k
        self.by_model = by_model
        self.layout = layout
        self.max_context = max_context
        self.drafter = drafter if drafter is not None else NgramDrafter()
        self.counters = SpecCounters()
        # Rows a decode step may have before its projections leave their cheap path (the 4-bit
        # kernel's, models/layers.py): drafts never take a step past it, since every lane of
        # the step would pay (None: no such limit)
        self.max_step_rows: int | None = None

    def state(self, seq: Sequence) -> LaneSpec:
        if seq.spec is None:
            seq.spec = LaneSpec(AdaptiveK(self.max_k))
        return seq.spec

    def plan(self, seqs: Iterable[Sequence]) -> None:
        """Sets the drafts of every decoding sequence (oldest first) and grows its table for them."""
        pool = self.layout.pool
        decoding = [s for s in sorted(seqs, key=lambda s: s.order) if not s.is_prefilling and s.pending is not None]
        budget = self.max_context if self.max_step_rows is None else self.max_step_rows - len(decoding)
        for seq in decoding:
            spec = self.state(seq)
            spec.drafts, spec.draft_slots = (), 0
            conv = seq.conv
            k = min(spec.k.k(), self.max_context - conv.num_cells - 1, budget)
            if seq.target_cells:
                k = min(k, seq.target_cells - conv.num_cells - 2)  # the last token it may emit is its own
            if k <= 0:
                continue
            if self.by_model:
                while k and self.layout.num_chunks_to_grow(conv.table, conv.num_cells + 1 + k) > pool.num_free:
                    k -= 1
                if k:
                    self.layout.grow(conv.table, conv.num_cells + 1 + k)
                    spec.draft_slots = k
                    budget -= k
                continue
            drafts = self.drafter.propose(seq, k)[:k]
            if not drafts:
                continue
            while drafts and self.layout.num_chunks_to_grow(conv.table, conv.num_cells + 1 + len(drafts)) > pool.num_free:
                drafts = drafts[:-1]
            if drafts:
                self.layout.grow(conv.table, conv.num_cells + 1 + len(drafts))
                spec.drafts = tuple(drafts)
                budget -= len(drafts)

    def record(self, seqs: Mapping[str, Sequence], outcomes: Iterable[DraftOutcome], work: Iterable[LaneWork]) -> None:
        """The verify step's outcomes, into each lane's adaptive k and the counters."""
        by_id = {o.request_id: o for o in outcomes}
        for w in work:
            seq = seqs.get(w.request_id)
            if seq is None or seq.spec is None or not (w.num_drafts or w.draft_slots or len(w.token_ids) == 1):
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


def commit_drafts(seq: Sequence, w: LaneWork, outcome: DraftOutcome | None, cache: ConversationCache,
                  layout: KVLayout) -> None:
    """The conversation keeps the fed token and the kept drafts; the rest of the table's room
    past its cells goes back to the pool (whole chunks). With a draft model its K/V is
    written for the fed token and the drafts it was fed (all but the last proposed)."""
    conv = seq.conv
    drafts = w.token_ids[1:] if w.num_drafts else (outcome.tokens if outcome is not None else ())
    accepted = outcome.num_accepted if outcome is not None else 0
    kept = (w.token_ids[0], *drafts[:accepted])
    cache.extend(conv, kept)
    conv.table.num_cells = w.start + len(kept)
    if w.draft_slots:
        conv.draft_cells = w.start + 1 + min(accepted, max(0, len(drafts) - 1))
    copies = layout.truncate(conv.table, conv.table.num_cells)
    assert not copies, "a lane's tail chunk is private: giving back rejected cells copies nothing"
