"""The other lanes while a session file streams: a decoding stream's gaps between tokens
while a long conversation (1 GiB of K/V by default) is saved, then restored, against the
stream's median gap just before, when no file streams.

Arms, one after the other in each round, on one engine:
- inline: `Engine.save_session` / `restore_session` called between two steps: the engine
  waits for the whole file, as every save and restore did before they left the step path.
  It uses only what older trees have, so `--arms inline` measures them too;
- off the step path: `begin_save_session` / `begin_restore_session`, and the engine steps on
  until the job is done (the worker thread streams the file meanwhile);
- none: the same windows with no file at all, CONTROL_TOKENS long: the stream's own worst
  gap over its median, what a shared machine adds by itself (the floor of the other arms).
The worst gap counts every gap that overlaps the file's streaming; the ratio is that over the
median. Every restore is checked against what was saved (synthetic K/V, pool_parts/synthetic.py).
"""

from __future__ import annotations

import os
import statistics
import time

from benchmarks.pool_parts.synthetic import Synthetic, random_tokens

BASELINE_TOKENS = 40
CONTROL_TOKENS = 300


class StallArms:
    def __init__(self, num_cells: int, chunk: int, threads: int, work_dir: str):
        import torch

        from strata.config import EngineConfig
        from strata.engine.engine import Engine

        torch.set_num_threads(threads)
        chunks = -(-num_cells // chunk)
        cfg = EngineConfig(max_context=(chunks + 1) * chunk, batch=1, kv_chunk=chunk, threads=threads,
                           kv_pool_tokens=(chunks + 2) * chunk, prefill_chunk=512, spec="off")
        self.engine = Engine(cfg, progress=False)
        self.synthetic = Synthetic(self.engine._kv, seed=11)
        self.num_cells = num_cells
        self.path = os.path.join(work_dir, "stall.strata")
        self.vocab = self.engine.model_config.vocab_size

    def _tokens(self, rid: str, times: list[float], until) -> None:
        """Steps until `until()`; appends the arrival time of each of `rid`'s tokens to `times`."""
        while not until():
            for out in self.engine.step():
                if out.request_id == rid and out.new_token_ids:
                    times.extend([time.perf_counter()] * len(out.new_token_ids))

    def _measure(self, rid: str, run) -> dict:
        """`run(times)` streams a file (stepping, or not, meanwhile); the stream's gaps around it."""
        times: list[float] = []
        self._tokens(rid, times, lambda: len(times) >= BASELINE_TOKENS)
        median = statistics.median(b - a for a, b in zip(times, times[1:]))
        t0 = time.perf_counter()
        result = run(times)
        t1 = time.perf_counter()
        mark = len(times)
        self._tokens(rid, times, lambda: len(times) >= mark + 3)  # the gap that spans the end
        during = [b - a for a, b in zip(times, times[1:]) if b > t0 and a < t1]
        worst = max(during)
        return {"s": t1 - t0, "median_gap_s": median, "worst_gap_s": worst, "ratio": worst / median,
                "tokens_during": sum(1 for t in times if t0 < t < t1), "result": result}

    def round(self, arm: str) -> dict:
        from strata.sampling import SamplingParams

        e = self.engine
        tokens = random_tokens(self.num_cells, self.num_cells, self.vocab)
        conv = e.restore(tokens, [0])
        self.synthetic.fill(conv.table, self.num_cells)
        rid = e.submit(random_tokens(16, 7, self.vocab), SamplingParams(temperature=0, max_tokens=100000,
                                                                         ignore_eos=True))
        inline = arm == "inline"
        if arm == "none":
            def idle(times):
                end = len(times) + CONTROL_TOKENS
                self._tokens(rid, times, lambda: len(times) >= end)

            out = {"save": self._measure(rid, idle), "restore": self._measure(rid, idle), "bytes": 0}
            e.cancel(rid)
            e._scheduler.clear_cache()
            return out

        def save(times):
            if inline:
                return e.save_session(self.path, token_ids=tokens).num_bytes
            job = e.begin_save_session(self.path, token_ids=tokens)
            self._tokens(rid, times, lambda: job.done)
            return job.result.result().num_bytes

        def restore(times):
            if inline:
                return e.restore_session(self.path).conv_id
            job = e.begin_restore_session(self.path)
            self._tokens(rid, times, lambda: job.done)
            return job.result.result().conv_id

        out = {"save": self._measure(rid, save)}
        e._scheduler.clear_cache()
        out["restore"] = self._measure(rid, restore)
        restored = e._scheduler.cache.get(out["restore"]["result"])
        if not self.synthetic.check(restored.table, self.num_cells):
            raise AssertionError("the restored K/V differs from the saved K/V")
        out["bytes"] = out["save"]["result"]
        e.cancel(rid)
        e._scheduler.clear_cache()
        os.unlink(self.path)
        return out
