"""The expert cache (`--moe-resident N`): every expert in host memory, N slots per MoE layer
on the compute device, an ExpertBank whose results equal the ResidentBank's.

Host memory is the source of truth (pinned where the compute device is an accelerator, so
copies are non-blocking). Each MoE layer has `num_slots` slots (ExpertWeights.empty_like
on the compute device: on the CPU they are still their own buffers, and the same copies
happen); slots.py decides, per run, whether the expert is a hit, is copied into a slot
(evicting by `--moe-evict`), or runs where it lives, as cost.py's model says (a setup
whose compute device is the host always copies). `hint(layer, experts)`, when prefetch is
on, copies the next layer's likely experts into its slots ahead of its step, on a side
stream where CUDA exists (a slot's reader waits for its copy's event).

Tokens are counted at the first MoE layer (its rows are the step's tokens times the experts
per token): per token computed, prompt, decode and draft rows alike.

Added to the ExpertBank protocol: `hint`, `resize` (the device budget's re-split, between
steps), `stats`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from strata.moe.cost import CostModel
from strata.moe.slots import ExpertSlots, SlotCounters, Take

if TYPE_CHECKING:
    from strata.models.experts import ExpertWeights


def expert_params(e: ExpertWeights) -> int:
    """Weights in the expert's projections (the cost model's P)."""
    def count(lin) -> int:
        if hasattr(lin, "runs"):
            return sum(count(r) for r in lin.runs)
        if lin.weight is not None:
            return lin.weight.numel()
        return sum(p.out_features * p.in_features for p in lin.quant.parts)
    return count(e.gate_up) + count(e.down)


def _layout(e: ExpertWeights) -> list[tuple]:
    return [(tuple(t.shape), t.dtype) for t in e.tensors()]


class CachedBank:
    def __init__(self, experts: list[list[ExpertWeights]], num_slots: int, device: torch.device | str,
                 policy: str, experts_per_token: int, prefetch: bool = False, cost: CostModel | None = None,
                 ops=None, host_ops=None):
        """`experts[layer][e]`: host-memory experts (dense layers: an empty list); `num_slots`:
        slots per MoE layer (at most its experts); `cost`: None copies every miss."""
        self.device = torch.device(device)
        self.accelerated = self.device.type != "cpu"
        self.host = [[self._pinned(e) for e in layer] for layer in experts] if self.accelerated else experts
        for n, layer in enumerate(self.host):
            if any(_layout(e) != _layout(layer[0]) for e in layer):
                raise ValueError(f"layer {n}: every expert of a layer must have the same storage layout")
        self.policy = policy
        self.prefetch = prefetch
        self.cost = cost
        self.ops = ops
        self.host_ops = host_ops if self.accelerated else ops
        self.expert_bytes = [layer[0].num_bytes if layer else 0 for layer in self.host]
        self.params = [expert_params(layer[0]) if layer else 0 for layer in self.host]
        self.slots = [ExpertSlots(0, policy) for _ in self.host]
        self.buffers: list[list[ExpertWeights]] = [[] for _ in self.host]
        self.ready: list[dict[int, torch.cuda.Event]] = [{} for _ in self.host]  # slot -> its prefetch copy
        self.stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self.experts_per_token = experts_per_token
        self.first_layer = next((n for n, layer in enumerate(self.host) if layer), None)
        self.rows = 0  # rows run at the first MoE layer
        self.num_slots = 0
        self.budget = None  # --device-memory: the DeviceBudget whose split sizes the slots (for stats)
        self.resize(num_slots)

    @staticmethod
    def _pinned(e: ExpertWeights) -> ExpertWeights:
        if all(t.is_pinned() for t in e.tensors()):
            return e
        p = e.empty_like("cpu", pin=True)
        p.copy_from(e)
        return p

    @property
    def moe_layers(self) -> list[int]:
        return [n for n, layer in enumerate(self.host) if layer]

    # ---- the ExpertBank protocol --------------------------------------------------------------
    def plan(self, layer: int, experts: Sequence[int]) -> None:
        self.slots[layer].begin(experts)

    def run(self, layer: int, expert: int, x: torch.Tensor) -> torch.Tensor:
        rows = x.shape[0]
        if layer == self.first_layer:
            self.rows += rows
        copy = self.cost is None or self.cost.copies(self.expert_bytes[layer], self.params[layer], rows,
                                                     x.shape[-1] * x.element_size())
        t = self.slots[layer].take(expert, copy, rows)
        if t.slot is None:
            y = self.host[layer][expert](x.to("cpu"), self.host_ops)
            return y.to(x.device, non_blocking=self.accelerated)
        ev = self.ready[layer].pop(t.slot, None)  # a prefetch into this slot, read or overwritten now
        if ev is not None:
            torch.cuda.current_stream(self.device).wait_event(ev)
        if t.copied:
            try:
                self.buffers[layer][t.slot].copy_from(self.host[layer][expert], non_blocking=self.accelerated)
            except BaseException:
                self.slots[layer].forget(expert)  # the slot holds part of a copy: it holds nothing
                raise
        return self.buffers[layer][t.slot](x, self.ops)

    # ---- added: prefetch, the budget's re-split, tokens, stats ------------------------------------
    def hint(self, layer: int, experts: Sequence[int]) -> None:
        """The layer's likely experts for this step (its router on the hidden state one layer
        before it), most likely first: with prefetch on, the missing ones are copied now."""
        if not self.prefetch or not self.host[layer]:
            return
        takes = self.slots[layer].hint(experts)
        if not takes:
            return
        if self.stream is None:
            for t in takes:
                self._fill(layer, t)
            return
        self.stream.wait_stream(torch.cuda.current_stream(self.device))  # readers of the victims come first
        with torch.cuda.stream(self.stream):
            for t in takes:
                self._fill(layer, t)
                ev = torch.cuda.Event()
                ev.record(self.stream)
                self.ready[layer][t.slot] = ev

    def _fill(self, layer: int, t: Take) -> None:
        e = self.slots[layer].expert_of_slot[t.slot]
        self.buffers[layer][t.slot].copy_from(self.host[layer][e], non_blocking=self.accelerated)

    def resize(self, num_slots: int) -> None:
        """Between steps: `num_slots` slots per MoE layer (capped at each layer's experts)."""
        assert num_slots >= 0
        self.num_slots = num_slots
        for ready in self.ready:  # moves and releases come after every prefetch copy
            for ev in ready.values():
                torch.cuda.current_stream(self.device).wait_event(ev)
            ready.clear()
        for n, layer in enumerate(self.host):
            want = min(num_slots, len(layer))
            bufs = self.buffers[n]
            for src, dst in self.slots[n].resize(want):
                bufs[dst].copy_from(bufs[src])
            del bufs[want:]
            bufs += [layer[0].empty_like(self.device) for _ in range(want - len(bufs))]

    @property
    def tokens(self) -> int:
        return self.rows // self.experts_per_token

    def layer_counters(self, layer: int) -> SlotCounters:
        return self.slots[layer].counters

    def bytes_copied(self, layer: int) -> int:
        c = self.slots[layer].counters
        return (c.copies + c.prefetches) * self.expert_bytes[layer]

    def stats(self) -> dict:
        total = SlotCounters()
        layers = []
        for n in self.moe_layers:
            c = self.slots[n].counters
            total.add(c)
            layers.append({"layer": n, "slots": self.slots[n].num_slots, "hits": c.hits, "misses": c.misses,
                           "evictions": c.evictions, "bytes_copied": self.bytes_copied(n)})
        copied = sum(self.bytes_copied(n) for n in self.moe_layers)
        tok = self.tokens
        return {
            "resident": self.num_slots, "evict": self.policy, "prefetch": self.prefetch,
            "miss": "copy" if self.cost is None else "cost model",
            "slot_bytes": sum(self.expert_bytes[n] * self.slots[n].num_slots for n in self.moe_layers),
            **{k: v for k, v in vars(total).items()},
            "hit_ratio": total.hits / total.runs if total.runs else 0.0,
            "bytes_copied": copied, "tokens": tok,
            "bytes_copied_per_token": copied / tok if tok else 0.0,
            "hits_per_token": total.hits / tok if tok else 0.0,
            "misses_per_token": total.misses / tok if tok else 0.0,
            "layers": layers,
            "budget": self.budget.stats() if self.budget is not None else None,
        }
