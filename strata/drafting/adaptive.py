"""How many drafts a lane proposes: from its recent acceptance, only as many as pay.

Model: each draft is kept with probability `alpha` (the lane's recent acceptance, an
exponential average of kept / tried per verify step; a draft after a rejected one is
not tried). With k drafts a step gives E(k) = 1 + alpha + ... + alpha^k tokens and costs
1 + DRAFT_COST_FIRST + DRAFT_COST_MORE * (k - 1) plain decode steps (the verify forward
reads k more rows; the first extra row costs the most). The lane
proposes the k <= max_k with the best E(k) / cost(k), and none when no k beats 1: open
chat, where drafts are rejected, stops drafting. A lane that stopped tries one draft
every PROBE_EVERY steps, so it notices when its text starts repeating. No torch here.
"""

from __future__ import annotations

from dataclasses import dataclass

# The verify forward's cost over a one-row decode step, in decode steps, as benchmarks/spec.py
# measures it (its DRAFT_COST table, docs/benchmarks.md): each verify row past the first adds
# the x8 kernel's integer work for one more row of activations.
DRAFT_COST_FIRST = 0.28
DRAFT_COST_MORE = 0.33
PRIOR = 0.5  # the acceptance a lane starts from
WEIGHT = 0.3  # of the latest verify step in the average
# A stopped lane's probe: a step without a draft costs nothing extra, and a step whose
# lookup finds no n-gram proposes nothing, so probes are cheap; rarer probes miss the
# repeating stretches that follow a rejected pair of steps.
PROBE_EVERY = 4


@dataclass
class AdaptiveK:
    max_k: int
    alpha: float = PRIOR
    steps_without: int = 0  # decode steps since the last draft
    num_drafted: int = 0
    num_accepted: int = 0

    def k(self) -> int:
        best, best_k = 1.0, 0
        tokens = 1.0
        for k in range(1, self.max_k + 1):
            tokens += self.alpha**k
            value = tokens / (1.0 + DRAFT_COST_FIRST + DRAFT_COST_MORE * (k - 1))
            if value > best:
                best, best_k = value, k
        if best_k == 0 and self.steps_without >= PROBE_EVERY:
            return 1
        return best_k

    def record(self, num_drafted: int, num_accepted: int) -> None:
        """A step proposed `num_drafted` (0: none) and kept `num_accepted`."""
        if num_drafted == 0:
            self.steps_without += 1
            return
        self.steps_without = 0
        tried = num_accepted + (1 if num_accepted < num_drafted else 0)
        self.alpha = (1 - WEIGHT) * self.alpha + WEIGHT * (num_accepted / tried)
        self.num_drafted += num_drafted
        self.num_accepted += num_accepted
