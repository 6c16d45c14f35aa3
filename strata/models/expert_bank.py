"""Where a mixture-of-experts layer's experts run: the one protocol between the model and
the expert cache.

Per step and MoE layer the model calls `plan(layer, experts)` once, with the distinct
experts the router chose for the step's rows in the order it will run them, then
`run(layer, e, x)` for each of them, x holding only the rows routed to `e`. A bank may copy
an expert into a slot, run it where it lives, or prefetch on `plan`; whatever it does, `run`
returns the same values as running the expert's own weights (the cache is invisible).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from strata.models.experts import ExpertWeights


class ExpertBank(Protocol):
    prefetch: bool  # whether the model should `hint` each next MoE layer's likely experts

    def plan(self, layer: int, experts: Sequence[int]) -> None: ...

    def hint(self, layer: int, experts: Sequence[int]) -> None: ...

    def stats(self) -> dict | None:
        """The bank's counters for snapshots (None: it keeps none)."""
        ...

    def run(self, layer: int, expert: int, x: torch.Tensor) -> torch.Tensor:
        """x [rows, hidden] -> [rows, hidden], the expert's output, not router-weighted."""
        ...


class ResidentBank:
    """Every expert on the compute device: `experts[layer][e]` (layer = the model's layer
    index; dense layers hold an empty list)."""

    prefetch = False

    def __init__(self, experts: list[list[ExpertWeights]], ops=None):
        self.experts = experts
        self.ops = ops

    def plan(self, layer: int, experts: Sequence[int]) -> None:
        pass

    def hint(self, layer: int, experts: Sequence[int]) -> None:
        pass

    def stats(self) -> None:
        return None

    def run(self, layer: int, expert: int, x: torch.Tensor) -> torch.Tensor:
        return self.experts[layer][expert](x, self.ops)
