"""Whether a missing expert is copied into a slot or run where it lives (host memory).

For an expert of B bytes and P parameters, and r rows routed to it this step:

    copy_s = B / link_bytes_per_s                                  (host -> device, one copy)
    host_s = max(B / host_bytes_per_s, 2 * P * r / host_flops_per_s)  (the host reads B once;
             + 2 * r * row_bytes / link_bytes_per_s                  rows go out and back)

and the miss is copied when `copy_s <= host_s`, else run on the host. The device's own
compute time is left out of both sides (it is the same whichever copy of the weights the
rows end up reading next to a copy, and far below both on any accelerator), and so is the
copy's later value (the expert stays for the steps after): with it left out the model leans
towards host runs for the few rows of a decode step and towards copies for a prefill's
many rows, which is the split the decision is for. The constants are stated per machine
(`CostModel.for_device`); a setup whose compute device is the host (the CPU) never asks:
every miss is copied there, so the slots and their counters are exercised exactly.

No torch here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CostModel:
    link_bytes_per_s: float  # host -> device copies (PCIe 4 x16: ~25e9 in practice)
    host_bytes_per_s: float  # host memory bandwidth a host run reads weights at
    host_flops_per_s: float  # host matrix-product throughput

    def __post_init__(self) -> None:
        assert min(self.link_bytes_per_s, self.host_bytes_per_s, self.host_flops_per_s) > 0

    def copy_s(self, num_bytes: int) -> float:
        return num_bytes / self.link_bytes_per_s

    def host_s(self, num_bytes: int, params: int, rows: int, row_bytes: int) -> float:
        compute = max(num_bytes / self.host_bytes_per_s, 2.0 * params * rows / self.host_flops_per_s)
        return compute + 2.0 * rows * row_bytes / self.link_bytes_per_s

    def copies(self, num_bytes: int, params: int, rows: int, row_bytes: int) -> bool:
        """True: copy the expert into a slot; False: run its rows on the host."""
        return self.copy_s(num_bytes) <= self.host_s(num_bytes, params, rows, row_bytes)

    @classmethod
    def for_device(cls, device_type: str) -> CostModel | None:
        """The stated constants for a compute device; None where the compute device is the host."""
        if device_type == "cpu":
            return None
        # A PCIe 4 x16 link and a server CPU socket (DDR5, AVX-512/AMX bf16): the seed engine's box.
        return cls(link_bytes_per_s=25e9, host_bytes_per_s=150e9, host_flops_per_s=2e12)
