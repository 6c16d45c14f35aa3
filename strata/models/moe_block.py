"""A mixture-of-experts MLP: the router, top-k routing as each family's transformers reference
computes it, the routed experts (run through an ExpertBank, models/expert_bank.py) and Qwen2-MoE's
sigmoid-gated shared expert.

Routing of a step's rows x [T, hidden]: router logits [T, E] = x W_r^T in the compute dtype,
probabilities softmax(logits) in float32, the top k of them, divided by their sum where
`cfg.norm_topk_prob` (Mixtral always), then cast to the compute dtype except for Mixtral,
whose reference multiplies the expert outputs by the float32 weights.

Compute: the T * k (row, expert) pairs are sorted by expert id (stable: rows ascending
within an expert), the rows gathered once in that order, and each active expert runs once,
one matrix product per projection over all of its rows (`bank.run`); the outputs, scaled by
their pairs' weights, are added into their rows (one `index_add_`: each row's experts in
ascending id order, as the reference adds them).
"""

from __future__ import annotations

from collections.abc import MutableMapping

import torch

from strata.models.config import ModelConfig
from strata.models.linear import fused_linear
from strata.models.quant import QuantWeight
from strata.models.experts import ExpertWeights


def mlp_name(i: int, suffix: str) -> str:
    return f"model.layers.{i}.mlp.{suffix}"


def take_expert(w: MutableMapping[str, torch.Tensor | QuantWeight], prefix: str, weight_mode: str,
                dtype: torch.dtype, device: torch.device) -> ExpertWeights:
    """The SwiGLU MLP under `prefix` (`{prefix}.gate_proj.weight`, up, down), taken out of `w`."""
    gate_up = fused_linear(w, [f"{prefix}.gate_proj.weight", f"{prefix}.up_proj.weight"], None, weight_mode,
                           dtype, device)
    return ExpertWeights(gate_up, fused_linear(w, [f"{prefix}.down_proj.weight"], None, weight_mode, dtype, device))


def take_experts(cfg: ModelConfig, w: MutableMapping[str, torch.Tensor | QuantWeight], i: int, weight_mode: str,
                 dtype: torch.dtype, device: torch.device) -> list[ExpertWeights]:
    """Layer i's routed experts, in expert id order."""
    return [take_expert(w, mlp_name(i, f"experts.{e}"), weight_mode, dtype, device) for e in range(cfg.num_experts)]


def route(logits: torch.Tensor, k: int, renormalise: bool, float_weights: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [T, E] -> (weights [T, k], experts [T, k] int64): the top k softmax probabilities
    (float32), renormalised to sum to 1 if asked, in logits' dtype unless `float_weights`."""
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    weights, experts = torch.topk(probs, k, dim=-1)
    if renormalise:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return (weights if float_weights else weights.to(logits.dtype)), experts


class MoEBlock:
    """Layer `layer`'s MoE MLP: h [T, hidden] -> [T, hidden]. Holds the router and the shared
    expert; the routed experts live in the bank the model passes in."""

    def __init__(self, cfg: ModelConfig, w: MutableMapping[str, torch.Tensor | QuantWeight], i: int,
                 weight_mode: str, dtype: torch.dtype, device: torch.device):
        self.layer = i
        self.k = cfg.experts_per_token
        self.renormalise = cfg.norm_topk_prob
        self.float_weights = cfg.arch == "mixtral"
        self.router = fused_linear(w, [mlp_name(i, "gate.weight")], None, weight_mode, dtype, device)  # [E, hidden]
        self.shared = self.shared_gate = None
        if cfg.shared_expert_intermediate_size:
            self.shared = take_expert(w, mlp_name(i, "shared_expert"), weight_mode, dtype, device)
            gate = mlp_name(i, "shared_expert_gate.weight")
            if gate in w and w[gate].dim() == 1:  # GGUF stores it as [hidden]
                w[gate] = w[gate].unsqueeze(0)
            self.shared_gate = fused_linear(w, [gate], None, weight_mode, dtype, device)  # [1, hidden]

    def projections(self) -> list:
        return [self.router] + ([self.shared.gate_up, self.shared.down, self.shared_gate] if self.shared else [])

    def __call__(self, h: torch.Tensor, bank, ops=None) -> torch.Tensor:
        weights, experts = route(self.router(h), self.k, self.renormalise, self.float_weights)
        flat = experts.reshape(-1)  # [T * k]: pair p is row p // k
        order = torch.argsort(flat, stable=True)
        rows = order // self.k  # [T * k]: the row of each pair, in expert order
        ids, counts = torch.unique_consecutive(flat[order], return_counts=True)
        ids, counts = ids.tolist(), counts.tolist()
        bank.plan(self.layer, ids)
        xs = h.index_select(0, rows)  # [T * k, hidden], grouped by expert
        outs, start = [], 0
        for e, n in zip(ids, counts):
            outs.append(bank.run(self.layer, e, xs[start:start + n]))
            start += n
        ys = torch.cat(outs) if len(outs) > 1 else outs[0]
        ys = (ys * weights.reshape(-1)[order].unsqueeze(1)).to(h.dtype)
        out = torch.zeros_like(h).index_add_(0, rows, ys)
        if self.shared is not None:
            out = out + torch.sigmoid(self.shared_gate(h)) * self.shared(h, ops)
        return out
