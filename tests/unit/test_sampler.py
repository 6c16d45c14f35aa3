"""Sampler: greedy is argmax, filters keep the right tokens, draws follow the
distribution, seeded rows do not depend on the batch, logprobs are raw log_softmax."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from strata.sampler import SampleOutput, Sampler, make_generator, row_argmax
from strata.sampling import SamplingParams

VOCAB = 49152


def draw_many(
    logits: list[float], params: SamplingParams, num_draws: int, seed: int = 0, sampler=None
) -> Counter:
    """Counts of `num_draws` tokens drawn from one row of `logits` (rows of one batch)."""
    sampler = sampler or Sampler()
    generator = make_generator(seed, "cpu")
    counts: Counter = Counter()
    rows = min(num_draws, 1000)
    batch = torch.tensor([logits] * rows)  # [rows, vocab]
    for _ in range(math.ceil(num_draws / rows)):
        out = sampler.sample(batch, [params] * rows, [generator] * rows)
        counts.update(out.token_ids)
    return counts


def chi_square(counts: Counter, probs: list[float]) -> float:
    total = sum(counts.values())
    return sum((counts.get(i, 0) - total * p) ** 2 / (total * p) for i, p in enumerate(probs))


def log(probs: list[float]) -> list[float]:
    return [math.log(p) for p in probs]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_greedy_is_argmax(dtype):
    logits = (torch.randn(6, 1000, generator=make_generator(1, "cpu")) * 4).to(dtype)
    params = [SamplingParams(temperature=0.0)] * 6
    out = Sampler().sample(logits, params, [None] * 6)
    assert out.token_ids == logits.float().argmax(dim=-1).tolist()
    assert out.logprobs == [None] * 6


@settings(max_examples=60, deadline=None)
@given(values=st.lists(st.sampled_from([0.0, 1.0, -1.5, 2.0, float("inf"), float("-inf"), float("nan")]),
                       min_size=3, max_size=40),
       rows=st.integers(1, 4), dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16, torch.float64]))
def test_row_argmax_is_torchs_argmax(values, rows, dtype):
    """The CPU's numpy argmax picks what torch's would: the first maximum, ties and NaN included."""
    logits = torch.tensor(values, dtype=torch.float64).roll(1).repeat(rows, 1)
    logits[:, :: rows + 1] -= 1.0  # rows differ
    logits = logits.to(dtype)
    with torch.inference_mode():
        got = row_argmax(logits)
    assert got.dtype == torch.long and torch.equal(got, logits.argmax(dim=-1))
    assert torch.equal(row_argmax(logits[:, 1:]), logits[:, 1:].argmax(dim=-1))  # a non-contiguous view


def test_greedy_ties_go_to_the_lowest_id():
    logits = torch.tensor([[0.0, 3.0, 1.0, 3.0], [5.0, 5.0, 5.0, 5.0]])
    out = Sampler().sample(logits, [SamplingParams(temperature=0)] * 2, [None, None])
    assert out.token_ids == [1, 0]


def test_greedy_does_not_touch_its_generator():
    generator = make_generator(3, "cpu")
    before = generator.get_state()
    Sampler().sample(torch.randn(1, 50), [SamplingParams(temperature=0)], [generator])
    assert torch.equal(before, generator.get_state())


@pytest.mark.parametrize("temperature", [0.3, 1.0, 7.0, 100.0])
def test_top_k_1_is_greedy_at_any_temperature(temperature):
    logits = torch.randn(8, 3000, generator=make_generator(2, "cpu"))
    params = [SamplingParams(temperature=temperature, top_k=1)] * 8
    generators = [make_generator(i, "cpu") for i in range(8)]
    for _ in range(5):
        assert Sampler().sample(logits, params, generators).token_ids == logits.argmax(-1).tolist()


def test_top_k_keeps_the_k_most_likely():
    logits = [0.0, 0.5, 3.0, 2.9, 0.1, 2.8, 1.0]
    counts = draw_many(logits, SamplingParams(temperature=100.0, top_k=3), 3000)
    assert set(counts) == {2, 3, 5}


def test_top_p_keeps_the_smallest_set_reaching_p():
    probs = [0.5, 0.3, 0.2]
    assert set(draw_many(log(probs), SamplingParams(top_p=0.6), 3000)) == {0, 1}
    assert set(draw_many(log(probs), SamplingParams(top_p=0.45), 3000)) == {0}
    assert set(draw_many(log(probs), SamplingParams(top_p=0.85), 3000)) == {0, 1, 2}
    # Shuffled ids: the nucleus follows probability, not position.
    shuffled = [0.2, 0.5, 0.3]
    assert set(draw_many(log(shuffled), SamplingParams(top_p=0.6), 3000)) == {1, 2}


def test_top_p_applies_to_what_top_k_left():
    # After top_k=2: [0.625, 0.375]; top_p=0.6 then keeps only id 0.
    counts = draw_many(log([0.5, 0.3, 0.2]), SamplingParams(top_k=2, top_p=0.6), 2000)
    assert set(counts) == {0}


def test_top_p_nucleus_wider_than_the_candidates():
    # 64 equally likely tokens on top, the rest far less likely: the nucleus for
    # top_p=0.5 is 32 of the 64 tokens, wider than 4 candidates (grows 4 -> 64).
    logits = [5.0] * 64 + [-20.0] * 100
    counts = draw_many(logits, SamplingParams(top_p=0.5), 4000, sampler=Sampler(top_p_candidates=4))
    # Ties at the cut are kept: all 64 tokens share the boundary value.
    assert set(counts) == set(range(64))
    logits = [5.0 - 0.01 * i for i in range(64)] + [-20.0] * 100
    sampler = Sampler(top_p_candidates=4)
    counts = draw_many(logits, SamplingParams(top_p=0.5), 2000, sampler=sampler)
    nucleus = reference_allowed(logits, SamplingParams(top_p=0.5), slack=0.0)
    assert 20 < len(nucleus) < 32
    assert set(counts) == nucleus


def test_min_p_excludes_tokens_below_the_fraction_of_the_max():
    # min_p=0.2 -> keep p >= 0.1: ids 0, 1, 2; never 3 (0.05) or 4 (0.02).
    probs = [0.5, 0.28, 0.15, 0.05, 0.02]
    counts = draw_many(log(probs), SamplingParams(min_p=0.2), 4000)
    assert set(counts) == {0, 1, 2}


@pytest.mark.parametrize(
    ("params", "keep"),
    [
        (SamplingParams(temperature=1.0), range(8)),
        (SamplingParams(temperature=0.5), range(8)),
        (SamplingParams(temperature=2.0, top_k=4), range(4)),
        (SamplingParams(temperature=0.8, min_p=0.1), None),
    ],
)
def test_draws_follow_the_filtered_softmax(params, keep):
    logits = [2.0, 1.6, 1.1, 0.9, 0.2, -0.3, -0.5, -1.2]
    scaled = torch.tensor(logits, dtype=torch.float64) / params.temperature
    probs = torch.softmax(scaled, dim=0)
    if keep is None:
        keep = [i for i in range(8) if probs[i] >= params.min_p * probs.max()]
    mask = torch.zeros(8, dtype=torch.bool)
    mask[list(keep)] = True
    expected = torch.where(mask, probs, 0.0)
    expected = (expected / expected.sum()).tolist()
    counts = draw_many(logits, params, 20_000, seed=11)
    assert set(counts) == set(keep)
    kept = [p for p in expected if p > 0]
    stat = chi_square(Counter({j: counts[i] for j, i in enumerate(keep)}), kept)
    # 99.99% quantile of chi-square with up to 7 degrees of freedom is 29.9.
    assert stat < 30.0, (stat, counts, expected)


def test_seeded_rows_are_reproducible_and_batch_independent():
    sampler = Sampler()
    steps = [torch.randn(6, VOCAB, generator=make_generator(100 + s, "cpu")) * 3 for s in range(4)]
    target = SamplingParams(temperature=0.8, top_p=0.9, top_k=500, min_p=0.01, seed=1234)
    others = [
        SamplingParams(temperature=0),
        SamplingParams(temperature=1.3),
        SamplingParams(temperature=0.5, top_p=0.5, seed=9),
        SamplingParams(top_k=5, seed=1),
        SamplingParams(min_p=0.3, logprobs=3),
    ]

    def run(row: int, batch_size: int) -> list[int]:
        """The target's tokens when it sits at `row` of a batch of `batch_size` rows."""
        generator = make_generator(target.seed, "cpu")
        tokens = []
        for logits in steps:
            batch = logits[:batch_size].flip(0).clone()  # [batch_size, VOCAB]: other rows
            batch[row] = logits[0]  # the target sees the same logits wherever it sits
            params = [others[i % len(others)] for i in range(batch_size)]
            generators = [
                make_generator(7 + i, "cpu") if i % 2 else None for i in range(batch_size)
            ]
            params[row], generators[row] = target, generator
            tokens.append(sampler.sample(batch, params, generators).token_ids[row])
        return tokens

    alone = run(0, 1)
    assert run(0, 1) == alone
    assert run(0, 6) == alone
    assert run(3, 6) == alone
    assert run(5, 6) == alone
    other_seed = SamplingParams(temperature=0.8, top_p=0.9, top_k=500, min_p=0.01, seed=99)
    generator = make_generator(other_seed.seed, "cpu")
    others_tokens = [sampler.sample(s[:1], [other_seed], [generator]).token_ids[0] for s in steps]
    assert others_tokens != alone


def test_logprobs_are_raw_log_softmax():
    logits = torch.randn(4, 500, generator=make_generator(5, "cpu")) * 3
    params = [
        SamplingParams(temperature=0.0, logprobs=5),
        SamplingParams(temperature=0.3, top_k=3, logprobs=20),
        SamplingParams(logprobs=None),
        SamplingParams(temperature=2.0, logprobs=0),
    ]
    generators = [None, make_generator(1, "cpu"), None, make_generator(2, "cpu")]
    out = Sampler().sample(logits, params, generators)
    reference = torch.log_softmax(logits.double(), dim=-1)
    assert out.logprobs[2] is None
    for row in (0, 1, 3):
        entry = out.logprobs[row]
        assert entry is not None
        assert entry.token_id == out.token_ids[row]
        assert entry.logprob == pytest.approx(reference[row, entry.token_id].item(), abs=1e-5)
        assert len(entry.top) == params[row].logprobs
        top = reference[row].topk(len(entry.top))
        assert [i for i, _ in entry.top] == top.indices.tolist()
        for (_, value), expected in zip(entry.top, top.values.tolist()):
            assert value == pytest.approx(expected, abs=1e-5)
    assert out.logprobs[0].top[0][0] == out.token_ids[0]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_logits(dtype):
    logits = (torch.randn(3, 4000, generator=make_generator(8, "cpu")) * 2).to(dtype)
    params = [SamplingParams(top_p=0.9, logprobs=2), SamplingParams(top_k=10), SamplingParams()]
    out = Sampler().sample(logits, params, [make_generator(i, "cpu") for i in range(3)])
    assert isinstance(out, SampleOutput)
    assert all(0 <= t < 4000 for t in out.token_ids)
    assert out.logprobs[0] is not None and math.isfinite(out.logprobs[0].logprob)


def test_masked_tokens_are_never_drawn():
    # -inf logits (e.g. padded vocab) and the very first ids must stay out.
    logits = torch.full((1, 300), -math.inf)
    logits[0, 200:203] = torch.tensor([1.0, 0.0, 2.0])
    counts = Counter()
    generator = make_generator(0, "cpu")
    for _ in range(300):
        counts.update(Sampler().sample(logits, [SamplingParams()], [generator]).token_ids)
    assert set(counts) == {200, 201, 202}


def test_bad_shapes_are_rejected():
    with pytest.raises(ValueError):
        Sampler().sample(torch.zeros(2, 5), [SamplingParams()], [None])
    with pytest.raises(ValueError):
        Sampler().sample(torch.zeros(5), [SamplingParams()], [None])


def test_make_generator():
    assert make_generator(None, "cpu") is None
    a, b = make_generator(-1, "cpu"), make_generator(2**64 - 1, "cpu")
    assert torch.equal(torch.rand(4, generator=a), torch.rand(4, generator=b))


def reference_allowed(logits: list[float], params: SamplingParams, slack: float) -> set[int]:
    """Tokens the filters may keep, by sorting; `slack` widens top-p and min-p cuts."""
    # Scaled in float32 as the sampler does, so that exact ties are the same ties.
    scaled = (torch.tensor(logits) / params.temperature).double()
    keep = torch.ones(len(logits), dtype=torch.bool)
    if 0 < params.top_k < len(logits):
        keep &= scaled >= scaled.sort(descending=True).values[params.top_k - 1]
    if params.top_p < 1.0:
        probs = torch.softmax(scaled.masked_fill(~keep, -math.inf), dim=0)
        values = probs.sort(descending=True).values
        before = values.cumsum(0) - values
        count = int((before < params.top_p + slack).sum())
        keep &= probs >= values[count - 1]
    probs = torch.softmax(scaled, dim=0)
    keep &= probs >= (params.min_p - slack) * probs.max()
    return set(torch.nonzero(keep).flatten().tolist())


@settings(max_examples=60, deadline=None)
@given(
    logits=st.lists(st.floats(-8, 8, width=32), min_size=2, max_size=40),
    temperature=st.floats(0.05, 5),
    top_k=st.integers(0, 45),
    top_p=st.floats(0.05, 1.0),
    min_p=st.floats(0.0, 1.0),
    seed=st.integers(0, 2**32),
)
def test_draws_stay_within_the_reference_filters(logits, temperature, top_k, top_p, min_p, seed):
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    if params.is_greedy:
        return
    counts = draw_many(logits, params, 200, seed=seed, sampler=Sampler(top_p_candidates=3))
    assert set(counts) <= reference_allowed(logits, params, slack=1e-4)
    # The most likely token always survives: it is drawn when it is the only one left.
    if len(reference_allowed(logits, params, slack=-1e-4)) == 1:
        assert set(counts) == {max(range(len(logits)), key=lambda i: (logits[i], -i))}
