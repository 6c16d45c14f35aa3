"""Verifying a lane's draft tokens against the model's own distribution (speculative decoding).

The verify step fed the lane's pending token and k drafts d_1..d_k in one forward, so row
i of its logits is the model's distribution for the token after d_i (row 0: after the
pending token). The longest prefix of drafts the model agrees with is kept, plus one
token of the model's own from the first row that disagreed (or the row after the last
draft when all were kept):

- greedy: d_{i+1} is kept while it is row i's argmax (ties: lowest id, as the sampler);
  the output is exactly what decoding one token at a time gives;
- sampled: drafts are proposals with all their mass on one token, so rejection sampling
  keeps d_{i+1} with probability p_i(d_{i+1}) (p: the row's distribution after
  temperature, top-k, top-p, min-p), and on a rejection draws from p_i without d_{i+1},
  renormalised: every emitted token has exactly the distribution p gives it. The uniforms
  come from the request's generator, so a seeded request is reproducible, though not the
  same draws as without drafts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from strata.sampler import Sampler, TokenLogprobs, draw, row_argmax
from strata.sampling import SamplingParams


@dataclass(frozen=True)
class Verified:
    token_ids: list[int]  # the kept drafts, then one token of the model's own
    logprobs: list[TokenLogprobs | None]  # one per token
    num_accepted: int  # drafts kept

    def __post_init__(self) -> None:
        assert len(self.token_ids) == self.num_accepted + 1


def verify(
    sampler: Sampler,
    logits: torch.Tensor,  # [k + 1, vocab] float32, the lane's rows in order
    drafts: Sequence[int],  # k
    params: SamplingParams,
    generator: torch.Generator | None,
    raw: torch.Tensor | None = None,  # [k + 1, vocab] before the request's logit controls (logprobs)
) -> Verified:
    k = len(drafts)
    assert logits.shape[0] == k + 1
    tokens: list[int] = []
    if params.is_greedy:
        targets = row_argmax(logits).tolist()
        while len(tokens) < k and drafts[len(tokens)] == targets[len(tokens)]:
            tokens.append(drafts[len(tokens)])
        tokens.append(targets[len(tokens)])
    else:
        weights = sampler.filtered_weights(logits, [params] * (k + 1))  # [k + 1, vocab]
        for i, d in enumerate(drafts):
            row = weights[i]
            total = row.cumsum(dim=0)[-1]  # cumsum: the same sum whatever else is in the batch
            u = torch.rand(1, generator=generator, device=logits.device)
            if bool(u * total < row[d]):  # probability p_i(d)
                tokens.append(d)
                continue
            row = row.clone()
            row[d] = 0.0
            tokens.append(int(draw(row[None], [generator])[0]))
            break
        else:
            tokens.append(int(draw(weights[k:], [generator])[0]))
    n = len(tokens)
    logprobs = sampler.logprobs_of((logits if raw is None else raw)[:n], [params] * n, torch.tensor(tokens, device=logits.device), tokens)
    return Verified(tokens, logprobs, n - 1)
