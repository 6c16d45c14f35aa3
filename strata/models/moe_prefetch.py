"""What prefetch asks for: the next MoE layer's likely experts, its router applied to this
layer's hidden state (the rows after this layer's attention, normed), before this layer's
experts run, so the copies overlap them."""

from __future__ import annotations

import torch

from strata.models.moe_block import MoEBlock, route


def likely_experts(block: MoEBlock, h: torch.Tensor) -> list[int]:
    """h [T, hidden] -> the distinct experts `block`'s router would pick for these rows, the
    most often picked first (ties: the lower id)."""
    _, experts = route(block.router(h), block.k, block.renormalise, block.float_weights)
    ids, counts = torch.unique(experts.reshape(-1), return_counts=True)
    order = sorted(zip(counts.tolist(), ids.tolist()), key=lambda t: (-t[0], t[1]))
    return [e for _, e in order]
