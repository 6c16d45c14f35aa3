"""The mixture-of-experts members of the Llama family: Mixtral, Qwen2-MoE (shared expert),
Qwen3-MoE (q/k norm per head), OLMoE (q/k norm over the whole projection).

Attention, norms, embedding and head are the Llama family's (llama.py); layer i's MLP is a
MoE block (moe_block.py) where `cfg.is_moe_layer(i)`, else the dense SwiGLU. The routed
experts are weights of the model (`experts[i][e]`, empty for dense layers: what the expert
cache copies from) and run through `self.bank` (models/expert_bank.py), remade by `prepare_runtime`
as a ResidentBank; the expert cache replaces it after the build.
"""

from __future__ import annotations

from collections.abc import MutableMapping, Sequence

import torch

from strata.models.config import ModelConfig
from strata.models.llama import DecoderLayer, LlamaModel
from strata.models.moe_block import MoEBlock, take_experts
from strata.models.quant import QuantWeight
from strata.models.expert_bank import ResidentBank
from strata.models.experts import ExpertWeights
from strata.models.moe_prefetch import likely_experts


class MoeDecoderLayer(DecoderLayer):
    def init_mlp(self, w: MutableMapping[str, torch.Tensor | QuantWeight], i: int, weight_mode: str) -> None:
        self.moe = None
        self.next_moe: MoEBlock | None = None  # the next MoE layer's block, for the cache's prefetch
        if not self.cfg.is_moe_layer(i):
            super().init_mlp(w, i, weight_mode)
            return
        norm = self.input_norm.weight
        self.moe = MoEBlock(self.cfg, w, i, weight_mode, norm.dtype, norm.device)
        self.gate_up = self.down = None

    def ffn(self, h: torch.Tensor, ops=None, bank=None, kinds=None) -> torch.Tensor:
        if self.moe is None:
            return super().ffn(h, ops, kinds=kinds)
        if self.next_moe is not None and bank.prefetch:
            bank.hint(self.next_moe.layer, likely_experts(self.next_moe, h))
        return self.moe(h, bank, ops)

    def projections(self) -> list:
        if self.moe is None:
            return super().projections()
        return [self.qkv, self.o] + self.moe.projections()


class MoeModel(LlamaModel):
    def __init__(self, cfg: ModelConfig, weights: MutableMapping[str, torch.Tensor | QuantWeight],
                 dtype: torch.dtype, layer_devices: Sequence[torch.device], max_positions: int,
                 weight_mode: str = "dense", fused: bool = True):
        self.experts: list[list[ExpertWeights]] = []  # [layer][expert], filled as layers are made
        super().__init__(cfg, weights, dtype, layer_devices, max_positions, weight_mode, fused)

    def make_layer(self, cfg: ModelConfig, weights, i: int, weight_mode: str) -> MoeDecoderLayer:
        layer = MoeDecoderLayer(cfg, weights, i, weight_mode)
        norm = layer.input_norm.weight
        self.experts.append(take_experts(cfg, weights, i, weight_mode, norm.dtype, norm.device)
                            if layer.moe is not None else [])
        return layer

    def prepare_runtime(self, max_positions: int, fused: bool = True) -> None:
        super().prepare_runtime(max_positions, fused)
        self.bank = ResidentBank(self.experts, self.ops)
        moe_layers = [layer for layer in self.layers if layer.moe is not None]
        for a, b in zip(moe_layers, moe_layers[1:]):
            a.next_moe = b.moe

    def projections(self) -> list:
        experts = [lin for layer in self.experts for e in layer for lin in (e.gate_up, e.down)]
        return [lin for layer in self.layers for lin in layer.projections()] + experts
