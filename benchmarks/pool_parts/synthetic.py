"""What the child arms share: an engine per layout, synthetic K/V, random prompts, memory now."""

from __future__ import annotations

import random
import time

from benchmarks.common import available_mib, rss_mib


def make_engine(p: dict, layout: str, max_context: int, batch: int, pool_tokens: int | None, prefill_chunk: int):
    import torch

    from strata.config import EngineConfig
    from strata.engine.engine import Engine

    torch.set_num_threads(p["threads"])
    cfg = EngineConfig(
        max_context=max_context,
        batch=batch,
        kv_chunk=p["chunk"],
        kv_pool_tokens=pool_tokens if layout == "pool" else None,
        prefill_chunk=prefill_chunk,
        threads=p["threads"],
    )
    return Engine(cfg, progress=False)


class Synthetic:
    """Synthetic K/V written straight into the storage through a conversation's chunk table.

    Chunk j of layer l gets a window of one random block at an offset that depends on (j, l),
    so every chunk of a conversation holds different values and a move that lands cells in
    the wrong chunk (or not at all) is caught by `check`.
    """

    SPREAD = 256

    def __init__(self, kv, seed: int):
        import torch

        g = torch.Generator().manual_seed(seed)
        heads, _, dim = kv.k[0].shape
        self.kv = kv
        self.block = torch.randn(heads, kv.chunk_size + self.SPREAD, dim, generator=g).to(kv.dtype)

    def _window(self, j: int, layer: int, is_v: bool, n: int):
        off = (j * 31 + layer * 7 + (self.SPREAD // 2 if is_v else 0)) % self.SPREAD
        return self.block[:, off : off + n]

    def _spans(self, table, num_cells: int):
        c = self.kv.chunk_size
        for j, cid in enumerate(table.chunk_ids):
            n = min(c, num_cells - j * c)
            if n <= 0:
                break
            yield j, slice(cid * c, cid * c + n), n

    def fill(self, table, num_cells: int) -> float:
        t = time.perf_counter()
        for j, cells, n in self._spans(table, num_cells):
            for layer in range(self.kv.num_layers):
                self.kv.k[layer].data[:, cells].copy_(self._window(j, layer, False, n))
                self.kv.v[layer].data[:, cells].copy_(self._window(j, layer, True, n))
            self.kv.cells_written(cells.start, n)  # a ring in front of the pool drops its copies
        return time.perf_counter() - t

    def check(self, table, num_cells: int) -> bool:
        """First, middle and last chunk, first and last layer, K and V: exactly what was written."""
        import torch

        spans = list(self._spans(table, num_cells))
        picks = {0, len(spans) // 2, len(spans) - 1}
        for j, cells, n in (spans[i] for i in sorted(picks)):
            for layer in {0, self.kv.num_layers - 1}:
                if not torch.equal(self.kv.k[layer].data[:, cells], self._window(j, layer, False, n)):
                    return False
                if not torch.equal(self.kv.v[layer].data[:, cells], self._window(j, layer, True, n)):
                    return False
        return True


def random_tokens(n: int, seed: int, vocab: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(100, vocab) for _ in range(n)]


def memory_now() -> dict:
    return {"rss_mib": rss_mib(), "available_mib": available_mib()}
