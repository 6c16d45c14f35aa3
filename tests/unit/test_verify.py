"""Verifying drafts (strata/drafting/verify.py): greedy keeps exactly the argmax path; sampled keeps
the model's distribution exactly (checked statistically on fixed logits)."""

from __future__ import annotations

import collections

import pytest
import torch

from strata.sampler import Sampler
from strata.sampling import SamplingParams
from strata.drafting.verify import verify

VOCAB = 6


def test_greedy_keeps_the_agreeing_prefix_and_adds_the_models_token():
    logits = torch.full((4, VOCAB), -1.0)
    for row, best in enumerate([2, 5, 1, 3]):
        logits[row, best] = 1.0
    greedy = SamplingParams(temperature=0)
    v = verify(Sampler(), logits, [2, 5, 4], greedy, None)
    assert (v.token_ids, v.num_accepted) == ([2, 5, 1], 2)
    v = verify(Sampler(), logits, [2, 5, 1], greedy, None)
    assert (v.token_ids, v.num_accepted) == ([2, 5, 1, 3], 3)
    v = verify(Sampler(), logits, [0, 5, 1], greedy, None)
    assert (v.token_ids, v.num_accepted) == ([2], 0)
    tie = torch.zeros(2, VOCAB)  # a tie: the lowest id, as the sampler's argmax
    assert verify(Sampler(), tie, [0], greedy, None).token_ids == [0, 0]


def _chi2(counts: collections.Counter, probs: torch.Tensor, n: int) -> float:
    expected = probs * n
    keep = expected > 0
    observed = torch.tensor([counts.get(i, 0) for i in range(len(probs))], dtype=torch.float64)
    assert observed[~keep].sum() == 0, "a token of probability 0 was drawn"
    return float(((observed[keep] - expected[keep]) ** 2 / expected[keep]).sum())


def reference_distribution(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Each row's distribution in float64: softmax(logits / temperature), then the top_k most
    likely tokens, then the most likely of those while the mass before each is short of
    top_p of theirs (OpenAI's nucleus), renormalised. No ties in these logits."""
    p = torch.softmax(logits.double() / params.temperature, dim=-1)
    out = torch.zeros_like(p)
    for row in range(p.shape[0]):
        order = p[row].argsort(descending=True).tolist()
        if params.top_k:
            order = order[: params.top_k]
        total, before, kept = sum(p[row, i] for i in order), 0.0, []
        for i in order:
            if before >= params.top_p * total:
                break
            kept.append(i)
            before += p[row, i]
        out[row, kept] = p[row, kept] / p[row, kept].sum()
    return out


@pytest.mark.parametrize("params", [SamplingParams(temperature=1.0), SamplingParams(temperature=1.0, top_k=3),
                                    SamplingParams(temperature=0.7, top_k=4, top_p=0.95)])
def test_sampled_output_has_the_models_distribution(params):
    """Rows 0 and 1 with drafts (d1, d2): the first token is distributed as row 0's p, and
    the second (when the first is d1, the only case it is row 1's) as row 1's p."""
    g = torch.Generator().manual_seed(7)
    logits = torch.randn(3, VOCAB, generator=g) * 1.5
    sampler = Sampler()
    p = reference_distribution(logits, params)  # written here: a sampler bug cannot cancel out
    d1, d2 = int(p[0].argsort()[-2]), int(p[1].argmax())  # a likely draft, not the likeliest
    n = 12000
    first, second = collections.Counter(), collections.Counter()
    accepted = 0
    for _ in range(n):
        v = verify(sampler, logits, [d1, d2], params, g)
        first[v.token_ids[0]] += 1
        if v.token_ids[0] == d1:
            second[v.token_ids[1]] += 1
        accepted += v.num_accepted >= 1
    # chi-square, 5 degrees of freedom at most: 30 is past the 1e-5 tail
    assert _chi2(first, p[0], n) < 30
    assert _chi2(second, p[1], sum(second.values())) < 30
    assert abs(accepted / n - float(p[0, d1])) < 5 * (float(p[0, d1]) * (1 - float(p[0, d1])) / n) ** 0.5


def test_a_draft_the_filters_removed_is_never_kept():
    logits = torch.tensor([[5.0, 4.0, -3.0, -4.0], [0.0, 0.0, 0.0, 0.0]])
    params = SamplingParams(temperature=1.0, top_k=2)
    g = torch.Generator().manual_seed(1)
    for _ in range(200):
        v = verify(Sampler(), logits, [3], params, g)
        assert v.num_accepted == 0 and v.token_ids[0] in (0, 1)
