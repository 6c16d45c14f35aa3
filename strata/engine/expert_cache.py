"""The expert cache and the device budget put into a built engine (engine/build.py).

`attach_expert_cache` checks the MoE flags against the model, replaces the model's
ResidentBank by a CachedBank when `--moe-resident` or `--device-memory` asks for one, and
with `--device-memory` makes the DeviceBudget and hands it to the ring: every lane's ring
is then granted by the budget when its request is admitted and given back when it ends, and
each change of the split resizes the expert slots (CachedBank.resize) and the ring's arena
(KVRing.resize_arena) between steps. Without a ring the K/V pool sits on the device and is
counted with the resident weights.
"""

from __future__ import annotations

import types

import torch

from strata.cells.ring_groups import GroupedRing
from strata.cells.storage import KVStorage
from strata.config import EngineConfig
from strata.errors import ConfigError
from strata.moe.budget import DeviceBudget
from strata.kv.budget_rule import MIB, BudgetShape
from strata.moe.cache import CachedBank
from strata.moe.cost import CostModel


def attach_expert_cache(config: EngineConfig, model, kv: KVStorage, ring: GroupedRing | None):
    """Returns (CachedBank or None, DeviceBudget or None)."""
    opts = config.moe
    experts = getattr(model, "experts", None) or []
    cfg = model.cfg
    num_experts = cfg.num_experts if any(experts) else 0
    opts.check_model(num_experts, cfg.experts_per_token)
    if opts.device_memory_mib is not None and not num_experts:
        raise ConfigError("--device-memory splits one budget between expert slots and rings: this model has no "
                          "experts (--kv-ring-budget sizes the rings alone)")
    if not num_experts or not opts.cached:
        return None, None
    moe_layers = [n for n, layer in enumerate(experts) if layer]
    devices = {model.layer_devices[n] for n in moe_layers}
    if len(devices) != 1:
        raise ConfigError("--moe-resident / --device-memory: the MoE layers must share one device (--devices)")
    device = torch.device(next(iter(devices)))
    slot_bytes = sum(experts[n][0].num_bytes for n in moe_layers)
    budget = None
    slots = opts.max_slots(num_experts)
    if opts.device_memory_mib is not None:
        resident = resident_bytes(model)
        sizing = config.ring_sizing
        if ring is None:  # the pool is on the device
            resident += kv.bytes_per_cell * kv.num_chunks * kv.chunk_size
        shape = BudgetShape(opts.device_memory_mib * MIB, resident, slot_bytes, opts.max_slots(num_experts),
                            opts.min_slots(num_experts, cfg.experts_per_token),
                            kv.bytes_per_cell if ring is not None else 0, config.num_lanes if ring is not None else 0,
                            sizing.floor_cells if ring is not None else 0)
        budget = DeviceBudget(shape)
        slots = budget.split.expert_slots
    bank = CachedBank(experts, slots, device, config.moe_evict, cfg.experts_per_token, prefetch=config.moe_prefetch,
                      cost=CostModel.for_device(device.type), ops=model.ops)
    model.bank = bank
    bank.budget = budget
    if budget is not None and ring is not None:
        ring.attach_budget(budget, lambda split: bank.resize(split.expert_slots))
    return bank, budget


def resident_bytes(model) -> int:
    """Every tensor the model holds but its routed experts (and the bank): projections,
    embedding, head, norms, rotary tables; a tensor reachable twice counts once."""
    skip = {id(model.experts), id(model.bank)}
    seen: set[int] = set()
    total = 0
    todo = [model]
    while todo:
        obj = todo.pop()
        if id(obj) in seen or id(obj) in skip:
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            total += obj.numel() * obj.element_size()
        elif isinstance(obj, (list, tuple)):
            todo.extend(obj)
        elif isinstance(obj, dict):
            todo.extend(obj.values())
        elif hasattr(obj, "__dict__") and not isinstance(obj, (type, types.ModuleType, types.FunctionType)):
            todo.extend(vars(obj).values())
    return total
