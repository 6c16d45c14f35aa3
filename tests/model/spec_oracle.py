"""A drafter for tests that knows the answer: it proposes the continuation a run without
drafts produced (from `reference`, keyed by the token stream so far), with every
`wrong_every`-th proposed token replaced by a wrong one, so that verify steps keep all,
some and none of their drafts. The verify step, the rollback and the pool are the real ones.
"""

from __future__ import annotations

from strata.engine.conversation import Sequence


class OracleDrafter:
    def __init__(self, wrong_every: int = 3):
        self.reference: list[list[int]] = []  # full token streams (prompt + greedy output)
        self.wrong_every = wrong_every
        self.num_proposed = 0

    def propose(self, seq: Sequence, k: int) -> list[int]:
        stream = [*seq.conv.token_ids, seq.pending]
        for ref in self.reference:
            if ref[: len(stream)] == stream:
                out = list(ref[len(stream) : len(stream) + k])
                for i in range(len(out)):
                    self.num_proposed += 1
                    if self.num_proposed % self.wrong_every == 0:
                        out[i] = out[i] + 1  # a token the model did not choose
                return out
        return []
