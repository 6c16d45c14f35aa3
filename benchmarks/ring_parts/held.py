"""One arm: an engine holding one or more SYNTHETIC conversations, extended by a short real turn
per round and decoded greedily; its decode steps are timed one by one so that several arms can
be stepped alternately (interleave.py).

Per round it records the decode steps only (after the turn's first token: the turn's prefill
is the TTFT), and the ring's counters over those steps: bytes and pages streamed per decoded
token, the hit ratio, the lane's ring (`lane_stats`), the `KV ring adaptive: a -> b` lines the
engine logged while sizing it, and the ring the rule predicts for the request.
"""

from __future__ import annotations

import logging
import time

from benchmarks.pool_parts.synthetic import Synthetic, random_tokens
from benchmarks.ring_parts import TURN, TURN_CELLS


class _Lines(logging.Handler):
    """Collects strata.ring's messages while one arm steps."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


_LINES = _Lines()
logging.getLogger("strata.ring").addHandler(_LINES)


def _counters(engine) -> tuple[int, int, int, int]:
    """(bytes copied, pages copied, page reads, page hits) of the ring so far; zeros without one."""
    if engine._ring is None:
        return 0, 0, 0, 0
    c = engine._ring.counters
    return c.bytes_copied, c.pages_streamed + c.pages_admitted, c.page_reads, c.page_hits


class HeldArm:
    def __init__(self, name: str, config, cells: int, conversations: int, seed: int):
        from strata.engine.engine import Engine

        self.name = name
        self.engine = e = Engine(config, progress=False)
        self.pooled = config.kv_pool_tokens is not None
        self.cuda = any(d.startswith("cuda") for d in config.devices)  # time steps to completion
        vocab = e.model_config.vocab_size
        synth = Synthetic(e._kv, seed=seed)  # same seed in every arm: every arm holds the same K/V
        self.tokens: list[list[int]] = []
        for c in range(conversations):
            conv = e.restore(random_tokens(cells, seed * 1000 + c, vocab), [0], lane=None if self.pooled else 0)
            synth.fill(conv.table, cells)
            self.tokens.append(list(conv.token_ids))
        self.turn = e.tokenizer.encode(TURN, add_special_tokens=False)
        assert len(self.turn) <= TURN_CELLS, f"the turn takes {len(self.turn)} cells, {TURN_CELLS} were planned"
        self.state: dict | None = None

    def submit(self, conversation: int, new: int) -> None:
        from strata.sampling import SamplingParams

        prompt = self.tokens[conversation] + self.turn
        params = SamplingParams(temperature=0, max_tokens=new + 1, ignore_eos=True)
        sizing = self.engine.config.ring_sizing
        self.state = {"conversation": conversation, "prompt": prompt, "out": [], "step_s": [], "log": [],
                      "expected_ring": sizing.ring_cells(len(prompt), new + 1) if sizing else None,
                      "rid": self.engine.submit(prompt, params), "at": None,
                      "submitted": _counters(self.engine)}

    @property
    def busy(self) -> bool:
        return self.engine.has_work

    def step(self) -> None:
        st = self.state
        del _LINES.lines[:]
        t = time.perf_counter()
        outs = self.engine.step()
        if self.cuda:
            import torch

            torch.cuda.synchronize()
        dt = time.perf_counter() - t
        st["log"] += _LINES.lines
        decoding = st["at"] is not None
        for o in outs:
            st["out"].extend(o.new_token_ids)
        if decoding:
            st["step_s"].append(dt)
        elif st["out"]:  # the turn is prefilled: its first token is out, decode steps follow
            st["turn_step_s"] = dt  # the step that prefilled the turn (and admitted pages)
            st["at"] = _counters(self.engine)

    def end_round(self) -> dict:
        st = self.state
        e = self.engine
        self.tokens[st["conversation"]] = st["prompt"] + st["out"]
        n = len(st["step_s"])
        b0, p0, r0, h0 = st["at"]
        b1, p1, r1, h1 = _counters(e)
        lane = e._ring.lane_stats(0) if e._ring is not None else None
        stats = e._ring.stats() if e._ring is not None else None
        return {
            "conversation": st["conversation"], "context_cells": len(st["prompt"]), "decode_steps": n,
            "step_s": st["step_s"], "turn_step_s": st["turn_step_s"], "out": st["out"],
            "bytes_per_token": (b1 - b0) / n if n else 0.0,
            "pages_per_token": (p1 - p0) / n if n else 0.0,
            "turn_bytes": b1 - st["submitted"][0],  # the turn's prefill step (admissions) and its decode
            "hit_ratio": (h1 - h0) / (r1 - r0) if r1 > r0 else None,
            "ring_cells": lane["ring_cells"] if lane else None,
            "expected_ring": st["expected_ring"],
            "log": list(st["log"]),
            "ring_stats": stats,
        }

    def close(self) -> None:
        self.engine = None
