"""SamplingParams: validation names the field; normalisation gives one spelling."""

from __future__ import annotations

import dataclasses
import math

import pytest

from strata.errors import RequestError
from strata.sampling import SamplingParams

BAD_VALUES = [
    ("max_tokens", 0),
    ("max_tokens", -3),
    ("max_tokens", 1.5),
    ("max_tokens", True),
    ("max_tokens", "8"),
    ("temperature", -0.1),
    ("temperature", 100.5),
    ("temperature", math.nan),
    ("temperature", math.inf),
    ("temperature", True),
    ("temperature", "1"),
    ("temperature", None),
    ("top_k", -2),
    ("top_k", 2.0),
    ("top_k", True),
    ("top_k", None),
    ("top_p", 0.0),
    ("top_p", -0.5),
    ("top_p", 1.01),
    ("top_p", math.nan),
    ("top_p", False),
    ("min_p", -0.01),
    ("min_p", 1.5),
    ("min_p", math.inf),
    ("min_p", -math.inf),
    ("seed", 1.5),
    ("seed", True),
    ("seed", "7"),
    ("stop", ""),
    ("stop", ["ok", ""]),
    ("stop", ["s"] * 17),
    ("stop", "x" * 257),
    ("stop", ["ok", "y" * 1000]),
    ("stop", [1]),
    ("stop", 5),
    ("stop", {"a"}),
    ("stop_token_ids", [-1]),
    ("stop_token_ids", [True]),
    ("stop_token_ids", [1.5]),
    ("stop_token_ids", "12"),
    ("stop_token_ids", 3),
    ("ignore_eos", 1),
    ("ignore_eos", "yes"),
    ("ignore_eos", None),
    ("logprobs", -1),
    ("logprobs", 21),
    ("logprobs", True),
    ("logprobs", 2.0),
]


@pytest.mark.parametrize(("field", "value"), BAD_VALUES)
def test_bad_value_names_the_field(field, value):
    with pytest.raises(RequestError) as info:
        SamplingParams(**{field: value})
    assert info.value.param == field
    assert info.value.code == "invalid_request_error"
    assert field in str(info.value)


def test_defaults():
    params = SamplingParams()
    assert params.max_tokens is None
    assert params.temperature == 1.0
    assert params.top_k == 0 and params.top_p == 1.0 and params.min_p == 0.0
    assert params.seed is None and params.logprobs is None
    assert params.stop == () and params.stop_token_ids == ()
    assert not params.ignore_eos
    assert not params.is_greedy


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_tokens": 1},
        {"temperature": 0},
        {"temperature": 100},
        {"top_k": 1},
        {"top_k": 50_000},
        {"top_p": 1e-9},
        {"min_p": 1.0},
        {"seed": -5},
        {"seed": 2**70},
        {"stop": ["s"] * 16},
        {"stop_token_ids": [0, 2]},
        {"logprobs": 0},
        {"logprobs": 20},
        {"ignore_eos": True},
    ],
)
def test_edge_values_are_accepted_as_given(kwargs):
    params = SamplingParams(**kwargs)
    for field, value in kwargs.items():
        assert getattr(params, field) == (tuple(value) if isinstance(value, list) else value), field


def test_stop_is_normalised_to_a_tuple():
    assert SamplingParams(stop="\n\n").stop == ("\n\n",)
    assert SamplingParams(stop=["a", "bc"]).stop == ("a", "bc")
    assert SamplingParams(stop=None).stop == ()
    assert SamplingParams(stop_token_ids=[3, 4]).stop_token_ids == (3, 4)
    assert SamplingParams(stop_token_ids=None).stop_token_ids == ()


def test_numbers_are_normalised():
    params = SamplingParams(temperature=1, top_p=1, min_p=0, top_k=-1)
    assert isinstance(params.temperature, float) and params.temperature == 1.0
    assert isinstance(params.top_p, float) and isinstance(params.min_p, float)
    assert params.top_k == 0


def test_is_frozen_and_hashable():
    params = SamplingParams(stop=["x"], stop_token_ids=[1])
    with pytest.raises(dataclasses.FrozenInstanceError):
        params.temperature = 0.5  # type: ignore[misc]
    assert hash(params) == hash(SamplingParams(stop="x", stop_token_ids=(1,)))


@pytest.mark.parametrize(
    ("kwargs", "greedy"),
    [
        ({"temperature": 0.0}, True),
        ({"temperature": 1e-7}, True),
        ({"temperature": 0.7, "top_k": 1}, True),
        ({"temperature": 0.7}, False),
        ({"temperature": 0.7, "top_k": 2}, False),
        ({"temperature": 1.0, "top_p": 1e-9}, False),
    ],
)
def test_is_greedy(kwargs, greedy):
    assert SamplingParams(**kwargs).is_greedy is greedy
