"""What the scheduler decided for one step: typed records between engine, runner and server."""

from __future__ import annotations

from dataclasses import dataclass

from strata.kv.table import CellCopy


@dataclass(frozen=True)
class LaneWork:
    """Tokens one lane feeds this step, and where their K/V goes."""

    lane: int
    request_id: str
    token_ids: tuple[int, ...]
    start: int  # position of token_ids[0] == cells already in the table
    chunk_ids: tuple[int, ...]  # the table, covering start + len(token_ids) cells
    do_sample: bool  # the last token's logits give the lane's next token

    @property
    def num_cells(self) -> int:
        return self.start + len(self.token_ids)


@dataclass(frozen=True)
class Admission:
    request_id: str
    lane: int
    num_cached: int  # prompt tokens whose K/V were reused


@dataclass(frozen=True)
class Refusal:
    """The pool could not hold a new request even after parked conversations gave way."""

    request_id: str
    num_chunks_needed: int
    num_chunks_free: int


@dataclass(frozen=True)
class StepPlan:
    copies: tuple[CellCopy, ...] = ()  # run before the forward (forks, reserved-layout moves)
    work: tuple[LaneWork, ...] = ()
    admitted: tuple[Admission, ...] = ()
    refused: tuple[Refusal, ...] = ()
    truncated: tuple[str, ...] = ()  # request ids ended because the pool could not grow them

    @property
    def is_empty(self) -> bool:
        return not self.work


@dataclass
class PoolCounters:
    """Monotonic counters of the pool's behaviour (exported on /metrics)."""

    num_evictions: int = 0
    num_refusals: int = 0
    num_truncations: int = 0
    num_moves_swap: int = 0
    num_moves_copy: int = 0
    num_cells_copied: int = 0
    num_cached_tokens: int = 0
