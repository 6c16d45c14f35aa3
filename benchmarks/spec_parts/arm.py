"""One arm: an engine (spec ngram or off) fed the same prompts as the other arms, stepped by
hand so that arms can take steps alternately (interleave.py).

Before a round's requests, `warm` prefills the same prompts (one token each, untimed), so
the round's requests find their prompts cached in their lanes and every lane starts
decoding within a step or two: otherwise lanes whose prefill ends early decode during the
others' prefill, faster in one arm than the other, and the arms' decode phases would hold
different shares of their tokens. Decode speed counts only pure decode steps: steps taken
once every submitted request has its first token, so no prefill row is timed. Per round:
decode_tokens = tokens those steps emitted, decode_s = their wall time; drafted / accepted
= the engine's draft counters over the round (all steps), and per request its timings'
draft_n / draft_n_accepted.
"""

from __future__ import annotations

import time


def _counters(engine) -> tuple[int, int, int]:
    d = engine._scheduler.drafts
    if d is None:
        return 0, 0, 0
    return d.counters.num_steps, d.counters.num_drafted, d.counters.num_accepted


class SpecArm:
    def __init__(self, name: str, config):
        from strata.engine.engine import Engine

        self.name = name
        self.engine = Engine(config, progress=False)
        self.state: dict | None = None

    def warm(self, prompts: list[list[int]]) -> int:
        """Prefills `prompts` into the lanes (one greedy token each); returns the steps taken."""
        from strata.sampling import SamplingParams

        for p in prompts:
            self.engine.submit(p, SamplingParams(temperature=0, max_tokens=1))
        steps = 0
        while self.engine.has_work:
            self.engine.step()
            steps += 1
        return steps

    def submit(self, prompts: list[list[int]], new: int) -> None:
        from strata.sampling import SamplingParams

        params = SamplingParams(temperature=0, max_tokens=new)  # greedy: both arms emit the same text
        rids = [self.engine.submit(p, params) for p in prompts]
        self.state = {"rids": rids, "out": {r: [] for r in rids}, "done": set(), "decode_s": 0.0,
                      "decode_tokens": 0, "decode_steps": 0, "step_s": [], "timings": {}, "cached": {},
                      "at": _counters(self.engine), "t0": time.perf_counter()}

    @property
    def busy(self) -> bool:
        return self.engine.has_work

    def step(self) -> None:
        st = self.state
        decoding = all(st["out"][r] or r in st["done"] for r in st["rids"])  # every prefill is done
        t = time.perf_counter()
        outs = self.engine.step()
        dt = time.perf_counter() - t
        emitted = 0
        for o in outs:
            if o.error is not None:
                raise RuntimeError(f"arm {self.name}: request {o.request_id} failed: {o.error}")
            st["out"][o.request_id].extend(o.new_token_ids)
            emitted += len(o.new_token_ids)
            if o.finished:
                st["done"].add(o.request_id)
                st["cached"][o.request_id] = o.num_cached_tokens
                if o.timings is not None:
                    st["timings"][o.request_id] = (o.timings.draft_n, o.timings.draft_n_accepted)
        if decoding and emitted:
            st["decode_s"] += dt
            st["decode_tokens"] += emitted
            st["decode_steps"] += 1
            st["step_s"].append(dt)

    def end_round(self) -> dict:
        st = self.state
        s0, d0, a0 = st["at"]
        s1, d1, a1 = _counters(self.engine)
        outs = [st["out"][r] for r in st["rids"]]
        return {
            "decode_s": st["decode_s"], "decode_tokens": st["decode_tokens"], "decode_steps": st["decode_steps"],
            "tok_s": st["decode_tokens"] / st["decode_s"] if st["decode_s"] else float("nan"),
            "tokens": sum(len(o) for o in outs), "out": outs,
            "verify_steps": s1 - s0, "drafted": d1 - d0, "accepted": a1 - a0,
            "request_drafts": [st["timings"].get(r) for r in st["rids"]],
            "cached_tokens": [st["cached"].get(r) for r in st["rids"]],
            "wall_s": time.perf_counter() - st["t0"],
        }

    def close(self) -> None:
        self.engine = None
