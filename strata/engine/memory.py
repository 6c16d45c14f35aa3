"""The memory guard: add up what the engine will hold before allocating any of it."""

from __future__ import annotations

from dataclasses import dataclass

import psutil

from strata.errors import ConfigError

MIB = 1 << 20


@dataclass(frozen=True)
class MemoryPlan:
    weight_bytes: int
    kv_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.weight_bytes + self.kv_bytes


def check_memory(plan: MemoryPlan, guard_mib: int, is_pooled: bool, available: int | None = None) -> None:
    """Refuse to start when holding `plan` would leave less than `guard_mib` MiB available."""
    available = psutil.virtual_memory().available if available is None else available
    left = available - plan.total_bytes
    if left >= guard_mib * MIB:
        return
    kv_flags = "--kv-pool-tokens" if is_pooled else "--max-context or --batch (or set --kv-pool-tokens)"
    raise ConfigError(
        f"not enough memory: weights {plan.weight_bytes / MIB:.0f} MiB + K/V {plan.kv_bytes / MIB:.0f} MiB "
        f"would leave {left / MIB:.0f} MiB of {available / MIB:.0f} MiB available, under "
        f"--memory-guard-mib {guard_mib}; lower {kv_flags}, --kv, or --dtype"
    )
