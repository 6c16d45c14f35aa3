"""The expert cache's and the device budget's flags, validated by name.

`--moe-resident N` (expert slots per MoE layer; every expert when absent), `--moe-evict`
(lru|lfu|lrfu), `--moe-prefetch` (copy the next layer's likely experts ahead),
`--device-memory MIB` (one budget for resident weights, expert slots and rings) and
`--moe-resident-min N` (the fewest slots per layer the budget may leave; the model's experts
per token when absent). `check_model` checks them against a model once it is loaded.
"""

from __future__ import annotations

from dataclasses import dataclass

from strata.errors import ConfigError
from strata.moe.evict import DEFAULT_EVICT, EVICT_POLICIES


def _count(value, flag: str, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{flag} must be an integer, got {value!r}")
    if value < minimum:
        raise ConfigError(f"{flag} must be at least {minimum}, got {value}")


@dataclass(frozen=True)
class MoEOptions:
    resident: int | None = None  # --moe-resident
    evict: str = DEFAULT_EVICT  # --moe-evict
    prefetch: bool = False  # --moe-prefetch
    device_memory_mib: int | None = None  # --device-memory
    resident_min: int | None = None  # --moe-resident-min

    def __post_init__(self) -> None:
        if self.resident is not None:
            _count(self.resident, "--moe-resident", 1)
        if self.evict not in EVICT_POLICIES:
            raise ConfigError(f"--moe-evict must be one of {', '.join(EVICT_POLICIES)}, got {self.evict!r}")
        if not isinstance(self.prefetch, bool):
            raise ConfigError(f"--moe-prefetch is on or off, got {self.prefetch!r}")
        if self.device_memory_mib is not None:
            _count(self.device_memory_mib, "--device-memory", 1)
        if self.resident_min is not None:
            if self.device_memory_mib is None:
                raise ConfigError("--moe-resident-min needs --device-memory (without it the slots are --moe-resident)")
            _count(self.resident_min, "--moe-resident-min", 0)
            if self.resident is not None and self.resident_min > self.resident:
                raise ConfigError(f"--moe-resident-min {self.resident_min} is above --moe-resident {self.resident}")

    @property
    def cached(self) -> bool:
        """Whether the experts go through the cache (else every expert is resident)."""
        return self.resident is not None or self.device_memory_mib is not None

    def check_model(self, num_experts: int, experts_per_token: int) -> None:
        """Against the loaded model: a model without experts takes none of these flags."""
        if num_experts == 0:
            for flag, value in (("--moe-resident", self.resident), ("--moe-resident-min", self.resident_min)):
                if value is not None:
                    raise ConfigError(f"{flag} is for mixture-of-experts models; this model has no experts")
            return
        if self.resident is not None and self.resident > num_experts:
            raise ConfigError(f"--moe-resident {self.resident} is above the model's {num_experts} experts per layer")
        if self.resident_min is not None and self.resident_min > num_experts:
            raise ConfigError(f"--moe-resident-min {self.resident_min} is above the model's "
                              f"{num_experts} experts per layer")

    def min_slots(self, num_experts: int, experts_per_token: int) -> int:
        if self.resident_min is not None:
            return self.resident_min
        return min(experts_per_token, self.max_slots(num_experts))

    def max_slots(self, num_experts: int) -> int:
        return self.resident if self.resident is not None else num_experts
