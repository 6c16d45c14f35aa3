"""How many cells of a conversation the resident ring holds (`--kv-resident`).

The rule (DESIGN.md, from the seed thread on sizing the ring):

    needed = round_up(prompt + max_new + one page, page)
    ring   = cap if needed >= cap else max(resident_min, default_ring)

with `cap = --kv-resident` and `default_ring = --kv-ring-default` (32768 unless set).
The ring only grows when it can cover the whole context: a shallow run keeps the
default ring exactly, so it never pays for cells it cannot use. Adaptive sizing is
opt-in through `STRATA_KV_RING_ADAPT`; without it every lane's ring is the cap.

Rings are whole pages: a ring of R cells holds `ceil(R / page)` pages per layer.
No torch here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from strata.errors import ConfigError

# The smallest ring and the smallest page, in cells: small enough that tests can use
# rings of a few pages of a tiny model.
RESIDENT_MIN = 16
DEFAULT_RING = 32768  # the engine's default ring (the seed engine's historical ring)
DEFAULT_PAGE = 256  # cells per page; benchmarks/ring.py --pages measures the others
ADAPT_ENV = "STRATA_KV_RING_ADAPT"
_OFF = ("", "0", "false")
_ON = ("1", "true")


def ring_adapt_enabled(environ: Mapping[str, str]) -> bool:
    """`STRATA_KV_RING_ADAPT`: 1 or true turn it on; unset, empty, 0 or false leave it off."""
    value = environ.get(ADAPT_ENV)
    if value is None or value.strip().lower() in _OFF:
        return False
    if value.strip().lower() in _ON:
        return True
    raise ConfigError(f"{ADAPT_ENV} must be 1 or true (on), or unset, empty, 0 or false (off); got {value!r}")


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


@dataclass(frozen=True)
class RingSizing:
    cap: int  # --kv-resident: cells per layer a lane may keep on the device
    page: int  # --kv-page
    default_ring: int = DEFAULT_RING  # --kv-ring-default
    adaptive: bool = False  # STRATA_KV_RING_ADAPT

    def __post_init__(self) -> None:
        if self.cap <= 0:
            raise ConfigError(f"--kv-resident must be positive, got {self.cap}")
        if self.cap < RESIDENT_MIN:
            raise ConfigError(f"--kv-resident must be at least {RESIDENT_MIN} cells, got {self.cap}")
        if self.default_ring <= 0:
            raise ConfigError(f"--kv-ring-default must be positive, got {self.default_ring}")

    def ring_cells(self, prompt: int, max_new: int) -> int:
        """The ring for a run of `prompt` tokens and up to `max_new` new ones, in cells
        (whole pages, never above the cap)."""
        if not self.adaptive:
            return self.cap_cells
        needed = round_up(prompt + max_new + self.page, self.page)
        if needed >= self.cap:
            return self.cap_cells
        return self.floor_cells

    @property
    def cap_cells(self) -> int:
        """The cap as whole pages (a cap inside a page rounds up to it)."""
        return round_up(self.cap, self.page)

    @property
    def floor_cells(self) -> int:
        """The default ring in whole pages, never above the cap: what a shallow run keeps, and what
        a lane keeps when the budget cannot give it more."""
        return min(self.cap_cells, round_up(max(RESIDENT_MIN, self.default_ring), self.page))

    def pages(self, cells: int) -> int:
        return -(-cells // self.page)


def window_ring_cells(window: int, step_cells: int, page: int) -> int:
    """The ring that holds every page a layer with `window` reads in a step writing up to
    `step_cells` cells: positions window_start(start) .. start + step_cells - 1 (window - 1 +
    step_cells cells) span at most ceil(that / page) + 1 pages."""
    return page * (-(-(window - 1 + step_cells) // page) + 1)
