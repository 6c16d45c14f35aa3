"""Tiers, rings and arms at a scale: the seed's sizes (1K / 32K / 128K, default ring 32768,
cap 49152) divided by `--scale` so the same shape of measurement fits on 2 CPU cores.

Invariants at every accepted scale: shallow tier + turn < default ring (every arm holds the
whole context); middle tier = default ring, so its context is just past the default ring
but under the cap (the adaptive arm keeps the default ring, the cap arm holds it all);
deep tier > cap (every ring streams). Default ring and cap are whole pages of every page
the sweep uses.
"""

from __future__ import annotations

from dataclasses import dataclass, field

FULL_TIERS = {"shallow": 1024, "middle": 32768, "deep": 131072}
FULL_DEFAULT_RING = 32768
FULL_CAP = 49152
ARMS = ("no-ring", "default", "cap", "adaptive")  # no-ring: the pool read in place, the ring's cost on its own


@dataclass(frozen=True)
class Geometry:
    scale: int
    page: int  # --kv-page of the main arms
    chunk: int = 4096
    tiers: dict[str, int] = field(init=False)
    default_ring: int = field(init=False)
    cap: int = field(init=False)

    def __post_init__(self) -> None:
        s = self.scale
        if s < 1 or FULL_DEFAULT_RING % s or FULL_CAP % s:
            raise ValueError(f"--scale must divide 32768 and 49152, got {s}")
        object.__setattr__(self, "tiers", {k: max(16, v // s) for k, v in FULL_TIERS.items()})
        object.__setattr__(self, "default_ring", FULL_DEFAULT_RING // s)
        object.__setattr__(self, "cap", FULL_CAP // s)

    def check_page(self, page: int) -> None:
        if self.chunk % page or self.default_ring % page or self.cap % page:
            raise ValueError(f"page {page} must divide the chunk {self.chunk}, the default ring "
                             f"{self.default_ring} and the cap {self.cap} (scale {self.scale})")

    def check_tiers(self, growth: int) -> None:
        """`growth`: cells a conversation gains over all rounds (turns + new tokens + max_new)."""
        t = self.tiers
        if t["shallow"] + growth + self.page > self.default_ring:
            raise ValueError(f"shallow tier {t['shallow']} + {growth} cells of turns does not fit the default ring")
        if t["middle"] + growth + 2 * self.page > self.cap:
            raise ValueError(f"middle tier {t['middle']} + {growth} cells of turns reaches the cap {self.cap}: "
                             "use fewer --new tokens or --rounds")

    def arm_config(self, arm: str, page: int | None = None, evict: str = "clock") -> dict:
        """EngineConfig fields of one arm (the rest is shared: model, threads, devices, context)."""
        page = page or self.page
        ring = {"kv_page": page, "kv_evict": evict, "kv_ring_default": self.default_ring}
        if arm == "no-ring":
            return {}
        if arm == "default":
            return {**ring, "kv_resident": self.default_ring, "kv_ring_adapt": False}
        if arm == "cap":
            return {**ring, "kv_resident": self.cap, "kv_ring_adapt": False}
        if arm == "adaptive":
            return {**ring, "kv_resident": self.cap, "kv_ring_adapt": True}
        raise ValueError(f"unknown arm {arm!r}")

    def describe(self) -> str:
        t = self.tiers
        return (f"scale 1/{self.scale}: tiers {t['shallow']} / {t['middle']} / {t['deep']} cells "
                f"(seed: 1K / 32K / 128K), default ring {self.default_ring} (32768), cap {self.cap} (49152), "
                f"page {self.page}")
