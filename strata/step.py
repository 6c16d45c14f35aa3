"""The records one step passes between the engine and the runner.

Both sides import this module (neither imports the other's package for them): the
scheduler plans a `StepPlan`, the runner executes it and returns a `StepOutput`, and
the scheduler commits that output. No torch here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from strata.kv.table import CellCopy

if TYPE_CHECKING:  # the sampler imports torch; these records do not need it
    from strata.sampler import TokenLogprobs


@dataclass(frozen=True)
class LaneDrafts:
    """A decoding lane's drafting for one step (strata/drafting)."""

    num_drafts: int = 0  # the lane's token_ids[1:] are drafts, verified this step (every row samples)
    # --spec draft: the runner's draft model proposes up to `slots` drafts (token_ids is then the
    # pending token alone), first feeding it `feed`: the tokens from position `feed_start` to the
    # pending token, whose draft-model K/V is not written yet
    slots: int = 0
    feed: tuple[int, ...] = ()
    feed_start: int = 0


@dataclass(frozen=True)
class LaneWork:
    """Tokens one lane feeds this step, and where their K/V goes."""

    lane: int
    request_id: str
    token_ids: tuple[int, ...]
    start: int  # position of token_ids[0] == cells the conversation holds (committed)
    chunk_ids: tuple[int, ...]  # the table, covering start + len(token_ids) cells
    do_sample: bool  # the last token's logits give the lane's next token
    # prompt + the most new tokens its request may take (sizes a ring; 0: unknown); a hint, not identity
    target_cells: int = field(default=0, compare=False)
    drafts: LaneDrafts | None = None  # a decoding lane's drafts (--spec); None: it does not draft
    # token_ids are prompt tokens (a prefill piece, of any length): the runner computes them on the
    # prompt path (dense projections and head, prefill attention) whether or not a prefix was
    # cached; else they are a decoding lane's (its pending token, drafts, a draft model's feed)
    prompt: bool = False
    # Each windowed layer group's table (kv/groups.py, groups 1..), None where a chunk is released:
    # the window of the lane's first new token onward is held. Empty: the model has one group.
    window_ids: tuple[tuple[int | None, ...], ...] = ()

    @property
    def num_cells(self) -> int:
        return self.start + len(self.token_ids)

    @property
    def reads_as_decode(self) -> bool:
        """Attention reads this lane as a decode row (one decoding token), not a piece."""
        return not self.prompt and len(self.token_ids) == 1

    @property
    def num_drafts(self) -> int:
        """Drafts among token_ids (verified this step)."""
        return self.drafts.num_drafts if self.drafts is not None else 0

    @property
    def draft_slots(self) -> int:
        """Drafts the runner's draft model proposes for this lane this step."""
        return self.drafts.slots if self.drafts is not None else 0


@dataclass(frozen=True)
class Admission:
    request_id: str
    lane: int
    num_cached: int  # prompt tokens whose K/V were reused
    has_copies: bool = False  # the step copies cells into its table (a fork, a reserved move)


@dataclass(frozen=True)
class Refusal:
    """The pool could not hold a new request even after parked conversations gave way."""

    request_id: str
    num_chunks_needed: int
    num_chunks_free: int


@dataclass(frozen=True)
class StepPlan:
    """What the scheduler decided for one step. Admissions, refusals and truncations are
    decided already (chunks are held); the work's progress is recorded only at commit."""

    copies: tuple[CellCopy, ...] = ()  # run before the forward (forks, reserved-layout moves)
    work: tuple[LaneWork, ...] = ()
    admitted: tuple[Admission, ...] = ()
    refused: tuple[Refusal, ...] = ()
    truncated: tuple[str, ...] = ()  # request ids ended because the pool could not grow them
    busy_lanes: tuple[int, ...] = ()  # lanes holding a running request, with work this step or not

    @property
    def is_empty(self) -> bool:
        return not self.work and not self.copies

    @property
    def request_ids(self) -> tuple[str, ...]:
        """The requests this step carries: its work and its admissions, each once."""
        return tuple(dict.fromkeys([*(w.request_id for w in self.work), *(a.request_id for a in self.admitted)]))


@dataclass(frozen=True)
class Sampled:
    request_id: str
    token_id: int
    logprobs: TokenLogprobs | None


@dataclass(frozen=True)
class DraftOutcome:
    request_id: str
    num_drafted: int
    num_accepted: int  # the first num_accepted drafts were kept
    tokens: tuple[int, ...] = ()  # the drafts, when the runner proposed them (--spec draft)


@dataclass(frozen=True)
class StepOutput:
    """What the runner computed: one sampled token per lane whose work samples, or, for a
    lane that verified drafts, its kept drafts and one more token, in order."""

    sampled: tuple[Sampled, ...] = ()
    drafts: tuple[DraftOutcome, ...] = ()
