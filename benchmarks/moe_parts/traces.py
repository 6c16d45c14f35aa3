"""Synthetic routing traces with stated locality (no published trace is used).

A trace is, per step and MoE layer, the distinct experts the step's tokens route to (in
expert-id order, as the model groups rows) with their row counts, plus a hint per layer:
what "the next layer's router applied to the current hidden state" would name, modelled
as the true experts, each replaced by a popularity-drawn other with probability
1 - `hint_accuracy` (an assumption, stated in the label: the synthetic trace has no hidden
state to apply a router to).

Locality: each layer has its own popularity, Zipf with exponent `zipf` over a random
permutation of its experts (0: uniform, what a random router gives); each token keeps each
of the previous token's experts of its lane with probability `reuse` (temporal reuse, as
consecutive tokens of one text do) and draws the rest by popularity without replacement.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class TraceSpec:
    name: str
    zipf: float
    reuse: float
    hint_accuracy: float = 0.8

    def label(self) -> str:
        return f"{self.name} (zipf {self.zipf:g}, reuse {self.reuse:g}, hint acc {self.hint_accuracy:g})"


TRACES = (
    TraceSpec("uniform", 0.0, 0.0),  # a random router: no locality at all
    TraceSpec("zipf", 1.0, 0.0),  # popular experts, no temporal reuse
    TraceSpec("zipf+reuse", 1.0, 0.5),  # popular experts and consecutive tokens sharing half
)


@dataclass
class Trace:
    spec: TraceSpec
    num_experts: int
    top_k: int
    lanes: int
    # steps[t][layer] = ((expert, rows), ...) in expert order; hints[t][layer] = experts, likeliest first
    steps: list[list[tuple[tuple[int, int], ...]]]
    hints: list[list[tuple[int, ...]]]

    @property
    def tokens(self) -> int:
        return len(self.steps) * self.lanes


def make_trace(spec: TraceSpec, layers: int, num_experts: int, top_k: int, steps: int, lanes: int = 1,
               seed: int = 0) -> Trace:
    rng = np.random.default_rng(seed)
    pop = []
    for _ in range(layers):
        w = 1.0 / np.arange(1, num_experts + 1) ** spec.zipf
        pop.append(w[rng.permutation(num_experts)] / w.sum())
    prev = [[() for _ in range(layers)] for _ in range(lanes)]
    out, hints = [], []
    for _ in range(steps):
        step, hint = [], []
        for n in range(layers):
            rows: dict[int, int] = {}
            for lane in range(lanes):
                keep = [e for e in prev[lane][n] if rng.random() < spec.reuse]
                chosen = list(keep)
                p = pop[n].copy()
                p[chosen] = 0.0
                chosen += list(rng.choice(num_experts, top_k - len(chosen), replace=False, p=p / p.sum()))
                prev[lane][n] = tuple(int(e) for e in chosen)
                for e in prev[lane][n]:
                    rows[e] = rows.get(e, 0) + 1
            step.append(tuple(sorted(rows.items())))
            guess = []
            for e, _ in sorted(rows.items(), key=lambda t: -t[1]):
                if rng.random() >= spec.hint_accuracy:
                    e = int(rng.choice(num_experts, p=pop[n]))
                if e not in guess:
                    guess.append(e)
            hint.append(tuple(guess))
        out.append(step)
        hints.append(hint)
    return Trace(spec, num_experts, top_k, lanes, out, hints)
