"""The Llama family: Llama 2/3, SmolLM2, Mistral, Qwen2/2.5 (q/k/v bias), Qwen3 (q/k norm);
sliding windows (Mistral, Qwen2) per layer, from `cfg.layer_windows`. Its mixture-of-experts
relatives (models/moe_model.py) replace the MLP of some layers (`DecoderLayer.init_mlp`, `ffn`).

Weights arrive under their Hugging Face names; each layer fuses q/k/v and gate/up into
one projection, so every linear layer runs once per step for all lanes together.
Layers may be split across devices: each layer lives on `layer_devices[i]`, the
embedding on the first layer's device, the final norm and LM head on the last.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, MutableMapping, Sequence
from typing import TYPE_CHECKING, Protocol

import torch
import torch.nn.functional as F

from strata.config import PROMPT_ATTENTION_ENV, prompt_attention_from_env
from strata.errors import ConfigError
from strata.models.attention import AttentionMeta, attend, attend_written
from strata.models.config import ModelConfig
from strata.models.fused import load_decode_ops
from strata.models.fused_layer import FusedDecodeLayer
from strata.models.head import make_head
from strata.models.layers import Embedding, RMSNorm, Rotary, apply_rotary, rope_inv_freq, silu_mul
from strata.models.linear import fused_linear
from strata.models.packed import PackedWeight, warm_packed
from strata.models.quant import QuantWeight
from strata.models.rows import RowKinds


if TYPE_CHECKING:
    from strata.cells.protocol import Cells


class LayerCells(Protocol):
    """Where a forward reads each layer's K/V: the pool's storage, or the ring's view of it for
    one step (cells/storage.py, cells/ring_step.py)."""

    def layer_caches(self, i: int) -> tuple[Cells, Cells]: ...


def layer_name(i: int, suffix: str) -> str:
    return f"model.layers.{i}.{suffix}"


class DecoderLayer:
    def __init__(self, cfg: ModelConfig, w: MutableMapping[str, torch.Tensor | QuantWeight], i: int, weight_mode: str):
        def get(suffix: str) -> torch.Tensor:
            return w[layer_name(i, suffix)]

        self.cfg = cfg
        self.input_norm = RMSNorm(get("input_layernorm.weight"), cfg.rms_norm_eps)
        self.post_norm = RMSNorm(get("post_attention_layernorm.weight"), cfg.rms_norm_eps)
        norm = self.input_norm.weight  # in the compute dtype, on this layer's device

        def linear(names: list[str], biases: list[str] | None):
            return fused_linear(w, [layer_name(i, n) for n in names], biases, weight_mode, norm.dtype, norm.device,
                                pack=True)

        biases = [layer_name(i, f"self_attn.{p}_proj.bias") for p in "qkv"] if cfg.attention_bias else None
        self.qkv = linear([f"self_attn.{p}_proj.weight" for p in "qkv"], biases)
        o_bias = layer_name(i, "self_attn.o_proj.bias")
        self.o = linear(["self_attn.o_proj.weight"], [o_bias] if o_bias in w else None)
        self.init_mlp(w, i, weight_mode)
        self.q_norm = self.k_norm = None
        if cfg.qk_norm:
            self.q_norm = RMSNorm(get("self_attn.q_norm.weight"), cfg.rms_norm_eps)
            self.k_norm = RMSNorm(get("self_attn.k_norm.weight"), cfg.rms_norm_eps)
        self.q_size = cfg.num_heads * cfg.head_dim
        self.kv_size = cfg.num_kv_heads * cfg.head_dim
        self.fused: FusedDecodeLayer | None = None  # set by prepare_runtime

    def prepare_runtime(self, ops) -> None:
        """The layer's one-call decode form with the fused ops `ops` (None: none)."""
        self.fused = FusedDecodeLayer.build(self, ops)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "fused": None}  # the extension's object is remade by prepare_runtime

    def init_mlp(self, w: MutableMapping[str, torch.Tensor | QuantWeight], i: int, weight_mode: str) -> None:
        """The MLP's projections, taken out of `w` (a MoE layer overrides this and `ffn`)."""
        norm = self.input_norm.weight
        self.gate_up = fused_linear(w, [layer_name(i, f"mlp.{p}_proj.weight") for p in ("gate", "up")], None,
                                    weight_mode, norm.dtype, norm.device, pack=True)
        self.down = fused_linear(w, [layer_name(i, "mlp.down_proj.weight")], None, weight_mode, norm.dtype, norm.device,
                                 pack=True)

    def ffn(self, h: torch.Tensor, ops=None, bank=None, kinds: RowKinds | None = None) -> torch.Tensor:
        """h [tokens, hidden] (post-attention normed) -> the MLP's output [tokens, hidden]."""
        return self.down(silu_mul(self.gate_up(h, kinds), ops), kinds)  # gate_up [tokens, 2 intermediate]

    def projections(self) -> list:
        return [self.qkv, self.o, self.gate_up, self.down]

    def __call__(
        self,
        x: torch.Tensor,  # [tokens, hidden]
        cos: torch.Tensor,  # [tokens, 1, head_dim / 2]
        sin: torch.Tensor,
        k_cache: Cells,  # [kv_heads, cells, head_dim]
        v_cache: Cells,
        meta: AttentionMeta,
        ops=None,  # the fused decode ops (models/fused.py), or None: torch ops
        bank=None,  # where MoE layers run their experts (models/expert_bank.py ExpertBank), or None
        kinds: RowKinds | None = None,  # which rows are decode rows (models/rows.py); None: all
    ) -> torch.Tensor:
        cfg = self.cfg
        if self.fused is not None:  # the whole layer in one call where the step allows (fused_layer.py)
            y = self.fused(x, cos, sin, k_cache, v_cache, meta, kinds)
            if y is not None:
                return y
        qkv = self.qkv(self.input_norm(x, ops), kinds)
        q = None
        targets = None
        if ops is not None and self.q_norm is None and qkv.is_contiguous():
            targets = k_cache.write_targets(v_cache, meta.write_index, qkv.dtype)
        if targets is not None:
            # One pass: q and k rotated, k and v written to their cells (no qk norm; where the
            # cells allow it; `ops` is set only on the CPU).
            q = ops.rope_write(qkv, cos.squeeze(1), sin.squeeze(1), targets.k, targets.v, targets.cells, cfg.num_heads,
                               cfg.num_kv_heads, k_scales=targets.k_scales, v_scales=targets.v_scales)
        if q is not None:
            a = attend_written(q, k_cache, v_cache, meta)
        else:
            a = attend(*self._rotated(qkv, cos, sin), k_cache, v_cache, meta)
        x, h = self.post_norm.add_and_norm(x, self.o(a, kinds), ops)
        return x + self.ffn(h, ops, bank, kinds)

    def _rotated(self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """q [t, heads, dim], k and v [t, kv_heads, dim] of the projection, q and k rotated."""
        cfg = self.cfg
        t = qkv.shape[0]
        q, k, v = qkv.split((self.q_size, self.kv_size, self.kv_size), dim=-1)
        v = v.view(t, cfg.num_kv_heads, cfg.head_dim)
        if self.q_norm is not None and cfg.qk_norm_full:  # OLMoE: each norm spans all heads
            q = apply_rotary(self.q_norm(q).view(t, cfg.num_heads, cfg.head_dim), cos, sin)
            k = apply_rotary(self.k_norm(k).view(t, cfg.num_kv_heads, cfg.head_dim), cos, sin)
        elif self.q_norm is not None:
            q = apply_rotary(self.q_norm(q.view(t, cfg.num_heads, cfg.head_dim)), cos, sin)
            k = apply_rotary(self.k_norm(k.view(t, cfg.num_kv_heads, cfg.head_dim)), cos, sin)
        else:  # q and k side by side: one rotation for both
            qk = apply_rotary(qkv[:, : self.q_size + self.kv_size].view(t, -1, cfg.head_dim), cos, sin)
            q, k = qk[:, : cfg.num_heads], qk[:, cfg.num_heads :]
        return q, k, v


class LlamaModel:
    def __init__(
        self,
        cfg: ModelConfig,
        weights: MutableMapping[str, torch.Tensor | QuantWeight],
        dtype: torch.dtype,
        layer_devices: Sequence[torch.device],
        max_positions: int,
        weight_mode: str = "dense",
        fused: bool = True,
    ):
        """`weights`: Hugging Face names -> tensors already in `dtype` on their layer's device,
        plus name + ".quant" -> QuantWeight (CPU) for tensors kept as the file stores them
        (`weight_mode` auto: beside the dense tensor; native: instead of it). The projections
        are taken out of it as they are fused (linear.fused_linear)."""
        assert len(layer_devices) == cfg.num_layers
        self.cfg = cfg
        self.dtype = dtype
        self.layer_devices = list(layer_devices)
        self.embedding = Embedding(weights.get("model.embed_tokens.weight"),  # [vocab, hidden], first device
                                   weights.get("model.embed_tokens.weight.quant"), dtype, self.layer_devices[0])
        self.layers = [self.make_layer(cfg, weights, i, weight_mode) for i in range(cfg.num_layers)]
        self.norm = RMSNorm(weights["model.norm.weight"], cfg.rms_norm_eps)
        head_name = "model.embed_tokens.weight" if cfg.tie_embeddings else "lm_head.weight"
        head, head_quant = weights.get(head_name), weights.get(head_name + ".quant")
        if head is not None:
            head = head.to(self.layer_devices[-1])
        self.lm_head = make_head(head, head_quant, weight_mode, dtype, self.layer_devices[-1])
        self.inv_freq = rope_inv_freq(cfg, weights.get("rope_freqs"))  # [head_dim / 2] float32
        self.devices = list(dict.fromkeys(self.layer_devices))
        self.prepare_runtime(max_positions, fused)

    def make_layer(self, cfg: ModelConfig, weights: MutableMapping[str, torch.Tensor | QuantWeight], i: int,
                   weight_mode: str) -> DecoderLayer:
        """Layer i, taking its projections out of `weights` (a family file overrides this)."""
        return DecoderLayer(cfg, weights, i, weight_mode)

    def prepare_runtime(self, max_positions: int, fused: bool = True) -> None:
        """What is not weights: rotary tables for positions 0..max_positions-1 on every device,
        and (`fused`) the fused decode ops where every layer is on the CPU (else None: torch ops)."""
        self.rotary = {d: Rotary(self.inv_freq, max_positions, self.dtype, d) for d in self.devices}
        self.ops = load_decode_ops(fused) if all(d.type == "cpu" for d in self.devices) else None
        for layer in self.layers:
            if isinstance(layer, DecoderLayer):
                layer.prepare_runtime(self.ops)
        self.bank = None  # where MoE layers run their experts (models/expert_bank.py; MoeModel sets it)

    def warm_up(self, max_rows: int) -> None:
        """Makes the dense GEMMs' kernels for every step of up to `max_rows` prompt rows now
        (models/packed.py `warm_packed`), not in the first step that needs each."""
        runs = [run for lin in self.projections() for run in getattr(lin, "runs", [lin])]
        warm_packed([r.weight for r in runs if isinstance(getattr(r, "weight", None), PackedWeight)], max_rows)

    @property
    def quant_max_rows(self) -> int | None:
        """The most rows a step may have for every projection to read its 4-bit form (auto:
        its dense copy beyond); None where some projection has no 4-bit form, or every step
        reads it (native)."""
        limits = [lin.max_rows for lin in self.projections()]
        return None if any(m is None for m in limits) else min(limits)

    def projections(self) -> list:
        """Every projection a step runs (a MoE model adds its experts')."""
        return [lin for layer in self.layers for lin in (layer.qkv, layer.o, layer.gate_up, layer.down)]

    @property
    def weight_forms(self) -> dict[str, int]:
        """How many projections read each form at decode rows: "x8" (strata's x8 kernel, q4x8.py),
        "int4" (torch's int4 kernel), "quant" (strata's kernels, the file's blocks), "dense"
        (prompt rows always are); "head": the LM head's form at decode rows ("x8": a Q8_0 head's q8x8
        form)."""
        forms: dict[str, int] = {}
        for lin in self.projections():
            for run in getattr(lin, "runs", [lin]):
                form = ("x8" if run.x8 is not None else "int4" if run.int4 is not None
                        else "quant" if run.quant is not None else "dense")
                forms[form] = forms.get(form, 0) + 1
        head = type(self.lm_head).__name__
        forms["head"] = {"Int8Head": "int8", "QuantHead": "quant", "X8Head": "x8"}.get(head, "dense")
        return forms

    def decode_attention_kernel(self, kv_dtype: torch.dtype) -> Callable | None:
        """The fused decode attention over spans (`DecodeSpans`) where it applies: the fused ops
        loaded (every layer on the CPU), a compute dtype of float32 or bfloat16, K/V stored in it
        or in int8 (`--kv int8`), a head dim that is a multiple of 16 up to 256, at most 16 query
        heads per K/V head. Else None: the torch reads."""
        cfg = self.cfg
        if self.ops is None or kv_dtype not in (self.dtype, torch.int8) or self.dtype not in (torch.float32, torch.bfloat16):
            return None
        if cfg.head_dim % 16 or cfg.head_dim > 256 or cfg.num_heads // cfg.num_kv_heads > 16:
            return None
        return getattr(self.ops, "decode_attention", None)

    def cell_copier(self) -> Callable | None:
        """The resident ring's page copies in one extension call per layer (csrc/copy_cells.cpp),
        or None (not built, not on the CPU, `STRATA_FUSED=0`): torch's `copy_` per run."""
        return getattr(self.ops, "copy_cells", None)

    def prompt_attention_kernel(self, kv_dtype: torch.dtype) -> Callable | None:
        """The AMX prompt attention (`PrefillSpans`) where it applies and `$STRATA_PROMPT_ATTENTION`
        allows it: the decode kernel's conditions, bfloat16, a head dim that is a multiple of 32,
        a CPU with AMX-BF16 whose tiles Linux grants. Else None: SDPA (and an error for `amx`)."""
        choice = prompt_attention_from_env()
        if choice == "sdpa":
            return None
        ok = (self.dtype == torch.bfloat16 and kv_dtype == self.dtype and self.cfg.head_dim % 32 == 0
              and self.decode_attention_kernel(kv_dtype) is not None
              and hasattr(self.ops, "prompt_attention") and self.ops.amx_available())
        if not ok and choice == "amx":
            raise ConfigError(f"${PROMPT_ATTENTION_ENV}=amx: needs bfloat16 compute and K/V, a head dim that is a "
                              "multiple of 32, and a CPU with AMX-BF16 (and this build of strata's extension)")
        return self.ops.prompt_attention if ok else None

    def __getstate__(self) -> dict:
        """Pickled as weights only (see loader/prepared.py): `prepare_runtime` remakes the rest."""
        return {k: v for k, v in self.__dict__.items() if k not in ("rotary", "ops", "bank")}

    def forward(
        self,
        input_ids: torch.Tensor,  # [tokens] on the first device
        positions: Mapping[torch.device, torch.Tensor],  # [tokens] per device
        metas: Mapping[torch.device, Mapping[int | None, AttentionMeta]],  # per device, per window
        kv: LayerCells,
        logits_rows: torch.Tensor,  # [rows] which token rows need logits (on the last device)
        kinds: RowKinds | None = None,  # which rows are decode rows (None: all of them)
    ) -> torch.Tensor:
        """Returns float32 logits [rows, vocab]. `kv.layer_caches(i)` gives layer i's K and V:
        the pool's own tensors, or the ring's view of them for this step (cells/ring.py).
        Layer i reads through the addressing of its window (`cfg.window(i)`, None: full)."""
        kinds = kinds or RowKinds.all_decode(input_ids.numel(), logits_rows.numel())
        x = self.embedding(input_ids)
        tables = {d: self.rotary[d].tables(positions[d]) for d in self.devices}
        for i, layer in enumerate(self.layers):
            dev = self.layer_devices[i]
            if x.device != dev:
                x = x.to(dev, non_blocking=True)
            cos, sin = tables[dev]
            x = layer(x, cos, sin, *kv.layer_caches(i), metas[dev][self.cfg.window(i)], self.ops, self.bank, kinds)
        x = self.norm(x.index_select(0, logits_rows), self.ops)
        return self.lm_head(x, kinds).float()
