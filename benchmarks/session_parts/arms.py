"""One engine on the default model, and one round of every arm at one conversation length."""

from __future__ import annotations

import os
import time

from benchmarks.pool_parts.synthetic import Synthetic, random_tokens


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def drop_from_page_cache(path: str) -> None:
    """The file's pages leave the page cache (it is fsynced: they are clean), so a read goes to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


class SessionArms:
    def __init__(self, max_cells: int, chunk: int, threads: int, work_dir: str):
        import torch

        from strata.config import EngineConfig
        from strata.engine.engine import Engine

        torch.set_num_threads(threads)
        max_context = max_cells + chunk
        cfg = EngineConfig(max_context=max_context, batch=0, kv_chunk=chunk, threads=threads,
                           kv_pool_tokens=-(-max_context // chunk) * chunk, prefill_chunk=512)
        self.engine = Engine(cfg, progress=False)
        self.synthetic = Synthetic(self.engine._kv, seed=7)
        self.path = os.path.join(work_dir, "bench.strata")
        self.vocab = self.engine.model_config.vocab_size

    def _restore(self) -> dict:
        e = self.engine
        before = _status("VmRSS")
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # VmHWM := RSS now
        restored = e.restore_session(self.path)
        peak = _status("VmHWM")
        conv = e._scheduler.cache.get(restored.conv_id)
        if not self.synthetic.check(conv.table, restored.num_cells):
            raise AssertionError("the restored K/V differs from the saved K/V")
        e._scheduler.clear_cache()
        return {"s": restored.seconds, "bytes": restored.num_bytes, "peak_extra_bytes": peak - before}

    def round(self, num_cells: int, prefill: bool) -> dict:
        from strata.sampling import SamplingParams

        e = self.engine
        tokens = random_tokens(num_cells, num_cells, self.vocab)
        conv = e.restore(tokens, [0])
        self.synthetic.fill(conv.table, num_cells)
        saved = e.save_session(self.path, token_ids=tokens)
        e._scheduler.clear_cache()
        out = {"save": {"s": saved.seconds, "bytes": saved.num_bytes}}
        drop_from_page_cache(self.path)
        out["restore_cold"] = self._restore()
        out["restore_warm"] = self._restore()
        os.unlink(self.path)
        if prefill:
            t = time.perf_counter()
            e.submit(tokens, SamplingParams(temperature=0, max_tokens=1))
            e.run_until_done()
            out["prefill"] = {"s": time.perf_counter() - t}
            e._scheduler.clear_cache()
        return out
