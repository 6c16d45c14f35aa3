"""One step through the resident ring (cells/ring.py): the copies it needs and where its pages are read.

`layer_caches(i)` runs layer i's copies (i one of the ring's layers: its layer group's) (pages admitted into their arena slots, streamed
pages into staging) and returns its K and V as `RingCells`. On CUDA the copies run on a
side stream one layer ahead (two staging buffers take turns) and the pool's copy of the
step's new cells is written back in `finish`; on the CPU both happen in place.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from strata.cells.protocol import Cells
from strata.cells.ring_cells import RingCells, StepWrites
from strata.kv.residency import ResidencyPlan

if TYPE_CHECKING:
    from strata.cells.ring import KVRing


@dataclass(frozen=True)
class PageMap:
    """Where this step's pages are read: page -> virtual cell of its first cell."""

    start: dict[int, int]
    num_arena_cells: int


def merge_runs(blocks: Sequence[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    """(src, dst, cells) blocks -> (src, dst, cells) runs, joining blocks that continue each other."""
    runs: list[list[int]] = []
    for src, dst, n in sorted(blocks):
        if runs and runs[-1][0] + runs[-1][2] == src and runs[-1][1] + runs[-1][2] == dst:
            runs[-1][2] += n
        else:
            runs.append([src, dst, n])
    return [tuple(r) for r in runs]


def _copy(dst: Cells, src: Cells, runs: Sequence[tuple[int, int, int]], non_blocking: bool) -> None:
    """(src cell, dst cell, cells) runs from `src` into `dst`, every part (cells on dim 1)."""
    for d, s in zip(dst.parts, src.parts):
        for src_start, dst_start, n in runs:
            d.narrow(1, dst_start, n).copy_(s.narrow(1, src_start, n), non_blocking=non_blocking)


class RingStep:
    """One step's copies and addressing; `layer_caches(i)` makes layer i's K/V readable."""

    def __init__(self, ring: KVRing, pages: PageMap, admit: list, stage: list, host_write_index: torch.Tensor,
                 writes: Sequence[int], plan: ResidencyPlan):
        self.ring = ring
        self.pages = pages
        self.admit = admit  # (pool cell, arena cell, cells)
        self.stage = stage  # (pool cell, staging cell, cells)
        self.host_write_index = host_write_index  # [tokens] on the host
        self.write_index = torch.tensor(writes, dtype=torch.long)  # [tokens] virtual cells (cells/ring_cells.py)
        split = StepWrites.split(writes, pages.num_arena_cells)
        self.plan = plan
        copier = ring.copy_cells  # one extension call per layer and copy kind; None: torch's copy_ per run
        self._runs = {kind: torch.tensor(runs, dtype=torch.long).view(-1, 3) if copier and runs else None
                      for kind, runs in (("admit", admit), ("stage", stage))}
        self.writeback: list | None = [] if ring.is_accelerated else None
        self._ready: dict[int, object] = {}  # layer -> the copy stream's event (accelerators)
        self._stream = None
        for d in ring.devices:
            ring.step_state[d].point(host_write_index, split if d.type == "cpu" else split.to(d), self.writeback)
        self._views = ring.layer_views()
        self._per_layer = ring.is_accelerated or bool(admit or stage)  # else each layer's views are read as they are

    def _issue(self, i: int, non_blocking: bool) -> None:
        r = self.ring  # nothing admitted or staged: everything read is resident already
        if self.admit:
            self._copy_pair(r.arena_k[i], r.arena_v[i], i, self.admit, self._runs["admit"], non_blocking)
        if self.stage:
            k_stage, v_stage = self.ring.staging_of(i)
            self._copy_pair(k_stage, v_stage, i, self.stage, self._runs["stage"], non_blocking)

    def _copy_pair(self, k_dst: Cells, v_dst: Cells, i: int, runs: Sequence[tuple[int, int, int]],
                   runs_tensor: torch.Tensor | None, non_blocking: bool) -> None:
        """Layer i's K and V `runs` from the pool into `k_dst`, `v_dst`."""
        r = self.ring
        if runs_tensor is not None:
            r.copy_cells([*k_dst.parts, *v_dst.parts], [*r.host.k[i].parts, *r.host.v[i].parts], runs_tensor)
            return
        _copy(k_dst, r.host.k[i], runs, non_blocking)
        _copy(v_dst, r.host.v[i], runs, non_blocking)

    def layer_caches(self, i: int) -> tuple[RingCells, RingCells]:
        if self._per_layer:
            dev = self.ring.layer_devices[i]
            if dev.type == "cuda":
                self._cuda_copies(i, dev)
            elif self.admit or self.stage:  # else everything read is resident already
                self._issue(i, non_blocking=False)
        return self._views[i]

    def _cuda_copies(self, i: int, dev: torch.device) -> None:
        """Layer i's copies were issued on the side stream while layer i-1 ran (or are issued now);
        the compute stream waits for them, then layer i+1's are issued behind layer i-1's reads."""
        if self._stream is None:
            self._stream = torch.cuda.Stream(dev)
        compute = torch.cuda.current_stream(dev)
        if i not in self._ready:
            self._issue_async(i, compute)
        compute.wait_event(self._ready.pop(i))
        layers = self.ring.layers  # its group's layers: the next one may be several model layers on
        r = self.ring.rank[i] + 1
        if r < len(layers) and self.ring.layer_devices[layers[r]] == dev:
            self._issue_async(layers[r], compute)

    def _issue_async(self, i: int, compute) -> None:
        done_before = torch.cuda.Event()
        done_before.record(compute)  # every read of the buffer layer i reuses was queued before this
        with torch.cuda.stream(self._stream):
            self._stream.wait_event(done_before)
            self._issue(i, non_blocking=True)
            ready = torch.cuda.Event()
            ready.record(self._stream)
        self._ready[i] = ready

    def finish(self) -> None:
        """The pool holds every cell the step wrote (accelerators write it back here)."""
        if not self.writeback:
            return
        for dev in self.ring.devices:
            if dev.type == "cuda":
                torch.cuda.current_stream(dev).synchronize()
        for host, index, x in self.writeback:
            host.write(index, x)
        self.writeback.clear()
