"""Building an engine's parts from its config: the model, the K/V layout and storage, the ring,
the runner and the scheduler (with its draft planner), after the memory guard has added up
what they will hold and before any of it is allocated."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from strata.cells.ring_groups import GroupedRing
from strata.cells.storage import KVStorage, kv_bytes_per_cell
from strata.config import EngineConfig, check_pool_covers_context
from strata.drafting.draft_model import check_draft_vocab, load_draft_model
from strata.drafting.planner import DraftPlanner, ModelPlanner, NgramPlanner
from strata.engine.memory import MemoryPlan, check_memory
from strata.engine.scheduler import Scheduler
from strata.kv.groups import LayerGroup, describe_groups, layer_groups, window_pool_chunks
from strata.kv.layout import KVLayout, PooledLayout
from strata.kv.reserve import ReservedLayout
from strata.kv.ring_rule import round_up, window_ring_cells
from strata.loader import ModelSource
from strata.loader.build import TORCH_DTYPES
from strata.loader.model_load import ModelLoad
from strata.loader.tokenizer import Tokenizer
from strata.models.config import ModelConfig
from strata.models.fused import load_quant_ops
from strata.models.llama import LlamaModel
from strata.models.q4x8 import Q8_RECORD
from strata.engine.expert_cache import attach_expert_cache
from strata.runner.runner import ModelRunner

log = logging.getLogger("strata")
groups_log = logging.getLogger("strata.groups")  # INFO: the layer groups' sizing (the command line shows it, strata/cli.py)


@dataclass
class EngineParts:
    model_config: ModelConfig
    tokenizer: Tokenizer
    fingerprint: str
    loaded_from_cache: bool  # the prepared-model cache had this build
    max_context: int
    layout: KVLayout
    kv: KVStorage
    ring: GroupedRing | None
    model: LlamaModel
    runner: ModelRunner
    scheduler: Scheduler


def num_weight_params(cfg: ModelConfig) -> int:
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    attention = cfg.hidden_size * (q + 2 * kv) + q * cfg.hidden_size
    embed = cfg.vocab_size * cfg.hidden_size
    return embed * (1 if cfg.tie_embeddings else 2) + sum(attention + cfg.mlp_params(i) for i in range(cfg.num_layers))


def kv_groups(config: EngineConfig, cfg: ModelConfig) -> tuple[LayerGroup, ...]:
    """The model's layer groups where the layout keeps them apart (kv/groups.py): pooled, with
    windows and `--kv-window-groups on` (with `--kv-resident`, a ring per group: cells/ring_groups.py;
    but `--device-memory`, whose budget grants one ring); else one group of every layer."""
    if (config.kv_pool_tokens is None or not cfg.windows or not config.kv_window_groups
            or (config.kv_resident is not None and config.device_memory is not None)):
        return (LayerGroup(None, tuple(range(cfg.num_layers))),)
    return layer_groups(cfg.layer_windows, cfg.num_layers)


def step_cells(config: EngineConfig) -> int:
    """The most cells one lane writes in a step: a prefill piece, or a pending token and its drafts."""
    return max(config.prefill_chunk, config.prefill_alone or 0, 1 + (config.spec_k if config.spec != "off" else 0))


def make_layout(config: EngineConfig, max_context: int, groups: tuple[LayerGroup, ...] = ()) -> KVLayout:
    if config.kv_pool_tokens is not None:
        check_pool_covers_context(config.kv_pool_tokens, max_context, config.kv_chunk)
        parked = config.num_lanes if config.kv_window_keep is None else config.kv_window_keep
        windows = [(g.window, window_pool_chunks(g.window, config.kv_chunk, config.num_lanes, step_cells(config),
                                                 parked)) for g in groups[1:]]
        return PooledLayout(config.kv_pool_tokens // config.kv_chunk, config.kv_chunk, windows)
    return ReservedLayout(config.num_lanes, max_context, config.kv_chunk)


def group_cells(layout: KVLayout, groups: tuple[LayerGroup, ...], num_layers: int) -> int:
    """Cells summed over every layer: each layer holds its group's pool."""
    if len(groups) <= 1:
        return layout.pool.num_cells_total * num_layers
    pools = (layout.pool, *layout.window_pools)
    return sum(len(g.layers) * p.num_cells_total for g, p in zip(groups, pools))


def ring_arenas(config: EngineConfig, groups: tuple[LayerGroup, ...]) -> list[int]:
    """Each group's ring arena in cells per layer (cells/ring_groups.py): the full group's is the
    budget; a windowed group's holds every lane's window ring, at most the budget."""
    budget = round_up(config.ring_budget, config.page)
    sizing = config.ring_sizing
    return [budget, *(min(budget, config.num_lanes * min(sizing.cap_cells, window_ring_cells(
        g.window, step_cells(config), config.page))) for g in groups[1:])]


def _weight_bytes(config: EngineConfig, load: ModelLoad) -> int:
    """The model's weights in the compute dtype; a GGUF file under `--weights native` holds its
    blocks as stored: the file's size (a type without a kernel loads dense: its warning says so);
    under `--weights auto` the dense copy and, beside it, at most the file's blocks (Q5_0's widened,
    `_widened_bytes`). Without the kernels, or on an accelerator, every mode holds the dense copy
    only (models/linear.py)."""
    path = load.path
    dense = num_weight_params(load.config) * torch.empty(0, dtype=TORCH_DTYPES[config.dtype]).element_size()
    in_place = load_quant_ops() is not None and all(d == "cpu" for d in config.devices)
    if (config.weights == "dense" or not in_place or path is None or not path.endswith(".gguf")
            or not os.path.isfile(path)):
        return dense
    if config.weights != "auto":
        return os.path.getsize(path)
    return os.path.getsize(path) + dense + _widened_bytes(load, config.dtype)


def _widened_bytes(load: ModelLoad, dtype: str) -> int:
    """Bytes `--weights auto` holds beyond a file's blocks: where decode rows read Q5_0 fused
    with Q8_0 through the q8x8 form (bfloat16, where strata's quantized kernels run: the
    caller's `in_place`; models/linear.py), each such 22-byte block becomes 34 (Q5_0 alone keeps its 22 in the q5x8
    form; the loader counts the blocks from the tensor table, gguf_file.widened_q5_0_blocks)."""
    if dtype != "bfloat16":
        return 0
    q5_0 = GGMLQuantizationType.Q5_0
    return load.widened_q5_0_blocks * (Q8_RECORD // 8 - GGML_QUANT_SIZES[q5_0][1])  # a record holds 8 columns' block


def _memory_plan(config: EngineConfig, load: ModelLoad, layout: KVLayout, draft: ModelLoad | None,
                 groups: tuple[LayerGroup, ...] = ()) -> MemoryPlan:
    """The weights and every K/V byte the engine will hold, every layer group's (the ring's
    arena too on the CPU)."""
    cfg = load.config
    cells = layout.pool.num_cells_total
    layer_cell = kv_bytes_per_cell(config.kv_dtype, 1, cfg.num_kv_heads, cfg.head_dim)
    kv_bytes = group_cells(layout, groups, cfg.num_layers) * layer_cell
    if config.kv_resident is not None and all(d == "cpu" for d in config.devices):  # the arena is host memory too
        kv_bytes += sum(len(g.layers) * n for g, n in zip(groups, ring_arenas(config, groups))) * layer_cell
    weight_bytes = _weight_bytes(config, load)
    if config.moe.cached and cfg.num_experts and all(d == "cpu" for d in config.devices):  # slots are host memory too
        moe_layers = sum(1 for i in range(cfg.num_layers) if cfg.is_moe_layer(i))
        slot = 3 * cfg.hidden_size * cfg.expert_intermediate_size * TORCH_DTYPES[config.dtype].itemsize  # dense: a bound
        weight_bytes += min(cfg.num_experts, config.moe.max_slots(cfg.num_experts)) * moe_layers * slot
    if draft is not None:  # its weights, and its K/V in every chunk of the pool
        d = draft.config
        weight_bytes += _weight_bytes(config, draft)
        kv_bytes += cells * kv_bytes_per_cell(config.kv_dtype, d.num_layers, d.num_kv_heads, d.head_dim)
    return MemoryPlan(weight_bytes, kv_bytes)


def _planner(config: EngineConfig, layout: KVLayout, max_context: int, model: LlamaModel) -> DraftPlanner | None:
    """The draft planner of `--spec`; drafts never take a step past the rows that read the
    4-bit weights (where a dense copy takes over, linear.py)."""
    if config.spec == "off":
        return None
    planner = ModelPlanner if config.spec == "draft" else NgramPlanner
    return planner(config.spec_k, layout, max_context, model.quant_max_rows)


def build_parts(config: EngineConfig, source: ModelSource | None, progress: bool) -> EngineParts:
    load = ModelLoad(config.model, config.dtype, config.weights, config.devices, source)
    cfg = load.config
    max_context = config.max_context or cfg.max_position
    if max_context > cfg.max_position:
        log.warning("--max-context %d is beyond the model's trained length %d: quality may drop",
                    max_context, cfg.max_position)
    groups = kv_groups(config, cfg)
    layout = make_layout(config, max_context, groups)
    pool = layout.pool
    draft_load = None
    if config.spec == "draft":
        draft_load = ModelLoad(config.draft_model, config.dtype, config.weights, config.devices)
        check_draft_vocab(draft_load, config.draft_model, cfg.vocab_size)  # before anything is allocated
    check_memory(_memory_plan(config, load, layout, draft_load, groups), config.memory_guard_mib, config.is_pooled)
    model = load.build(max_context, progress, config.fused)
    ring = None
    accelerated = any(d.type != "cpu" for d in model.layer_devices)
    on_host = config.kv_resident is not None  # the pool in host memory, a ring of pages on each layer's device
    kv = KVStorage(pool.num_total, pool.chunk_size, cfg.num_kv_heads, cfg.head_dim, config.kv_dtype,
                   [torch.device("cpu")] * cfg.num_layers if on_host else model.layer_devices,
                   pin_memory=on_host and accelerated, groups=groups,
                   group_chunks=(pool.num_total, *(p.num_total for p in layout.window_pools)))
    if on_host:
        ring = GroupedRing(kv, config.ring_sizing, config.kv_evict, config.ring_budget, model.layer_devices,
                           groups, config.num_lanes, step_cells(config), model.cell_copier())
    if len(groups) > 1:
        groups_log.info("KV layer groups: %s", describe_groups(
            groups, [p.num_total for p in (pool, *layout.window_pools)], pool.chunk_size,
            [kv.group_bytes_per_cell(g) for g in range(len(groups))]))
        if ring is not None:
            groups_log.info("KV ring per group: %s", ring.describe())
    draft = None
    if draft_load is not None:
        draft = load_draft_model(draft_load, config.kv_dtype, pool, max_context, progress, config.fused)
    attach_expert_cache(config, model, kv, ring)  # --moe-resident, --device-memory (engine/expert_cache.py)
    runner = ModelRunner(model, kv, ring, draft)
    scheduler = Scheduler(layout, config.num_lanes, max_context, config.prefill_chunk, config.prefill_alone,
                          _planner(config, layout, max_context, model))
    return EngineParts(cfg, load.tokenizer, load.fingerprint, load.from_cache, max_context, layout, kv, ring, model,
                       runner, scheduler)
