"""How one device budget (`--device-memory MIB`) is split between expert slots and rings.

    avail    = device - resident                 (weights that must stay: all but routed experts)
    reserve  = min_slots * slot + lanes * floor * cell
    ask      = min(ring rule(prompt, max_new), round_up(prompt + max_new, page))
    grant    = ask                if ask <= floor, or if ask - floor fits in
                                     avail - reserve - (other lanes' grants above their floor)
             = floor              otherwise (the lane keeps the default ring)
    slots    = min(max_slots, (avail - sum of busy lanes' grants * cell) // slot)

with `slot` the bytes of one expert slot in every MoE layer together (N slots per layer
cost N * slot), `cell` the bytes of one ring cell (K and V of every layer), `floor` the
ring rule's default ring (RingSizing.floor_cells), `min_slots = --moe-resident-min`,
`max_slots = --moe-resident` (every expert when absent). Every lane's floor is reserved
whether it is busy or not, so admitting a request never fails for want of ring; what an
idle lane does not use, and what a shallow run does not ask for, goes to expert slots. A
deep request's cells above the floor come out of expert slots, first come first served,
and go back when it finishes; slots never fall below `min_slots`, since
busy rings <= lanes * floor + (avail - reserve). The ring rule decides how big a lane's
ring may grow; the budget never gives a run more cells than it can fill. A grant is held
for its request (a lane's ring does not change under it).

No torch here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from strata.errors import ConfigError
from strata.kv.ring_rule import RingSizing, round_up

MIB = 1 << 20


@dataclass(frozen=True)
class BudgetShape:
    device_bytes: int  # --device-memory, in bytes
    resident_bytes: int  # weights on the device whatever the split (and the pool when there is no ring)
    slot_bytes: int  # one expert slot in every MoE layer together
    max_slots: int  # --moe-resident, or the experts per layer
    min_slots: int  # --moe-resident-min
    cell_bytes: int = 0  # one ring cell, every layer (0: no ring)
    num_lanes: int = 0  # lanes with a ring
    floor_cells: int = 0  # each lane's default ring, whole pages

    def __post_init__(self) -> None:
        assert self.slot_bytes > 0 and 0 <= self.min_slots <= self.max_slots
        if self.free_bytes < 0:
            mib = -(-(self.resident_bytes + self.reserve_bytes) // MIB)
            raise ConfigError(
                f"--device-memory {self.device_bytes // MIB} MiB cannot hold the resident weights "
                f"({self.resident_bytes / MIB:.0f} MiB), --moe-resident-min {self.min_slots} expert slots per layer "
                f"({self.min_slots * self.slot_bytes / MIB:.0f} MiB) and {self.num_lanes} default rings of "
                f"{self.floor_cells} cells ({self.num_lanes * self.floor_cells * self.cell_bytes / MIB:.0f} MiB): "
                f"it needs at least {mib} MiB")

    @property
    def avail_bytes(self) -> int:
        return self.device_bytes - self.resident_bytes

    @property
    def reserve_bytes(self) -> int:
        return self.min_slots * self.slot_bytes + self.num_lanes * self.floor_cells * self.cell_bytes

    @property
    def free_bytes(self) -> int:
        """What neither the resident weights nor the reserve hold: the cells above the floor and
        the slots above the minimum compete for it."""
        return self.avail_bytes - self.reserve_bytes


@dataclass(frozen=True)
class BudgetSplit:
    expert_slots: int  # per MoE layer
    ring_cells: tuple[tuple[int, int], ...]  # (lane, cells) of every busy lane, in admission order
    slot_bytes: int
    cell_bytes: int

    @property
    def expert_bytes(self) -> int:
        return self.expert_slots * self.slot_bytes

    @property
    def ring_bytes(self) -> int:
        return sum(c for _, c in self.ring_cells) * self.cell_bytes


def ring_ask(sizing: RingSizing, prompt: int, max_new: int) -> int:
    """The cells a run asks for: the ring rule's ring, never more than the run can fill."""
    return min(sizing.ring_cells(prompt, max_new), round_up(max(prompt + max_new, 1), sizing.page))


def grant(shape: BudgetShape, held: Mapping[int, int], ask: int) -> int:
    """The ring a newly admitted lane gets for `ask` cells, given the grants `held` by the other
    busy lanes."""
    if ask <= shape.floor_cells:
        return ask
    above = sum(max(0, c - shape.floor_cells) for c in held.values()) * shape.cell_bytes
    if above + (ask - shape.floor_cells) * shape.cell_bytes <= shape.free_bytes:
        return ask
    return shape.floor_cells


def expert_slots(shape: BudgetShape, held: Mapping[int, int]) -> int:
    """Slots per MoE layer left by the busy lanes' rings `held`."""
    rings = sum(held.values()) * shape.cell_bytes
    slots = min(shape.max_slots, (shape.avail_bytes - rings) // shape.slot_bytes)
    assert slots >= shape.min_slots, (slots, shape, dict(held))
    return slots


def split(shape: BudgetShape, held: Mapping[int, int]) -> BudgetSplit:
    return BudgetSplit(expert_slots(shape, held), tuple(held.items()), shape.slot_bytes, shape.cell_bytes)
