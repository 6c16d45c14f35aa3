"""Penalties, logit_bias and min_tokens against a reference written here, on fixed logits; the
verify step's rows equal what decoding one token at a time sees; the sampler and verify pick
from the adjusted rows while logprobs stay raw."""

from __future__ import annotations

import math

import pytest
import torch

from strata.drafting.verify import verify
from strata.errors import RequestError
from strata.logit_controls import LogitControls
from strata.sampler import Sampler
from strata.sampling import SamplingParams

VOCAB = 12


def reference(logits: list[float], prompt: list[int], output: list[int], p: SamplingParams,
              stop_ids: list[int]) -> list[float]:
    """The controls written out token by token (vLLM's order: min_tokens, bias, penalties)."""
    out = list(logits)
    if len(output) < p.min_tokens:
        for t in stop_ids:
            out[t] = -math.inf
    for t, b in dict(p.logit_bias).items():
        out[t] += b
    history = prompt + output
    if p.repeat_last_n:
        history = history[-p.repeat_last_n:]
    for t in set(history):
        if p.repetition_penalty != 1.0:
            out[t] = out[t] / p.repetition_penalty if out[t] > 0 else out[t] * p.repetition_penalty
    for t in set(output):
        out[t] -= p.frequency_penalty * output.count(t) + p.presence_penalty
    return out


CASES = [
    SamplingParams(frequency_penalty=0.7),
    SamplingParams(presence_penalty=-1.5),
    SamplingParams(frequency_penalty=0.3, presence_penalty=1.1),
    SamplingParams(repetition_penalty=1.6),
    SamplingParams(repetition_penalty=0.5, repeat_last_n=3),
    SamplingParams(logit_bias={"3": 5.0, "7": -100}),
    SamplingParams(min_tokens=4),
    SamplingParams(min_tokens=2, logit_bias=[(1, 2.5)], repetition_penalty=1.3, repeat_last_n=4,
                   frequency_penalty=0.5, presence_penalty=0.25),
]


@pytest.mark.parametrize("params", CASES, ids=[str(i) for i in range(len(CASES))])
def test_controls_match_the_reference(params):
    torch.manual_seed(0)
    prompt, stop_ids = [1, 4, 4, 9, 2], [0, 11]
    controls = LogitControls(params, prompt, stop_ids, VOCAB)
    output: list[int] = []
    for token in [4, 5, 5, 3, 4, 10]:
        logits = torch.randn(1, VOCAB) * 3
        want = reference(logits[0].tolist(), prompt, output, params, stop_ids)
        got = logits.clone()
        controls.apply(got)
        assert got[0].tolist() == pytest.approx(want, rel=1e-6, abs=1e-6)
        controls.accept(token)
        output.append(token)


@pytest.mark.parametrize("params", CASES, ids=[str(i) for i in range(len(CASES))])
def test_verify_rows_see_the_drafts_before_them(params):
    torch.manual_seed(1)
    prompt, stop_ids, drafts = [3, 3, 8], [0], [5, 5, 3]
    controls = LogitControls(params, prompt, stop_ids, VOCAB)
    controls.accept(6)
    logits = torch.randn(len(drafts) + 1, VOCAB)
    rows = logits.clone()
    controls.apply(rows, drafts)
    for i in range(len(drafts) + 1):
        one = LogitControls(params, prompt, stop_ids, VOCAB)
        for t in [6, *drafts[:i]]:
            one.accept(t)
        row = logits[i : i + 1].clone()
        one.apply(row)
        assert torch.equal(rows[i : i + 1], row), i
    assert controls.num_output == 1 and controls.counts == {6: 1}  # apply changed no state


def test_greedy_and_sampled_rows_choose_from_the_adjusted_logits():
    logits = torch.zeros(2, VOCAB)
    logits[:, 2] = 5.0  # the raw favourite
    banned = SamplingParams(temperature=0, logit_bias={"2": -100})
    sampled = SamplingParams(temperature=1.0, top_k=1, logit_bias={"2": -100, "6": 50}, logprobs=1, seed=3)
    chosen = logits.clone()
    LogitControls(banned, [], [], VOCAB).apply(chosen[0:1])
    LogitControls(sampled, [], [], VOCAB).apply(chosen[1:2])
    out = Sampler().sample(chosen, [banned, sampled], [None, torch.Generator().manual_seed(3)], raw=logits)
    assert out.token_ids[0] != 2 and out.token_ids[1] == 6
    raw_logprob = torch.log_softmax(logits[1], -1)[6].item()
    assert out.logprobs[1].logprob == pytest.approx(raw_logprob) and out.logprobs[1].top[0][0] == 2


def test_verify_rejects_a_draft_the_controls_ban():
    params = SamplingParams(temperature=0, logit_bias={"4": -100})
    logits = torch.zeros(3, VOCAB)
    logits[:, 4] = 3.0
    logits[:, 7] = 1.0
    chosen = logits.clone()
    LogitControls(params, [], [], VOCAB).apply(chosen, [4, 4])
    v = verify(Sampler(), chosen, [4, 4], params, None, raw=logits)
    assert v.token_ids == [7] and v.num_accepted == 0


@pytest.mark.parametrize("field, value", [
    ("presence_penalty", 2.5), ("frequency_penalty", -3), ("repetition_penalty", 0.0),
    ("repetition_penalty", 2.1), ("repeat_last_n", -2), ("min_tokens", -1),
    ("logit_bias", {"x": 1}), ("logit_bias", {"5": 101}), ("logit_bias", {"-1": 1}),
])
def test_bad_values_name_their_field(field, value):
    with pytest.raises(RequestError) as err:
        SamplingParams(**{field: value})
    assert err.value.param == field


def test_min_tokens_above_max_tokens_is_refused():
    with pytest.raises(RequestError) as err:
        SamplingParams(max_tokens=3, min_tokens=4)
    assert err.value.param == "min_tokens"
