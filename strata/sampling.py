"""What a request asks of the sampler and the stop logic: `SamplingParams`.

Validated once, at construction (the edge where user values enter); every bad value
raises `RequestError` whose `param` names the field. Downstream code (sampler,
detokenizer, scheduler) trusts a constructed `SamplingParams` without re-checking.

Normalisations (so consumers see one spelling per meaning):
- `stop`: a str, list or tuple (or None) becomes a tuple of str;
- `stop_token_ids`: a list or tuple (or None) becomes a tuple of int;
- `top_k`: -1 (OpenAI/vLLM's "off") becomes 0.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import InitVar, dataclass
from typing import Any

from strata.errors import RequestError

MAX_TEMPERATURE = 100.0
MAX_STOP_STRINGS = 16
# Characters per stop string. Stop strings are delimiters ("\n\n", "</answer>"); the cap
# bounds the text the detokenizer holds back (at most the longest stop string) and its
# per-token matching work.
MAX_STOP_LENGTH = 256
MAX_LOGPROBS = 20
MAX_PENALTY = 2.0  # presence_penalty and frequency_penalty lie in [-2, 2] (OpenAI's range)
MAX_REPETITION_PENALTY = 2.0  # repetition_penalty lies in (0, 2] (vLLM's range; 1 is off)
MAX_LOGIT_BIAS = 100.0  # logit_bias values lie in [-100, 100] (OpenAI's range)
MAX_LOGIT_BIAS_TOKENS = 1024
# Temperatures below this count as greedy: dividing logits by them overflows float32.
GREEDY_TEMPERATURE = 1e-5


def _is_int(value: Any) -> bool:
    # bool is a subclass of int; `True` must not pass as 1.
    return isinstance(value, int) and not isinstance(value, bool)


def _check_float(name: str, value: Any) -> float:
    """A finite real number (int or float, never bool); returns it as float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RequestError(f"{name} must be a number, got {value!r}", param=name)
    if not math.isfinite(value):
        raise RequestError(f"{name} must be finite, got {value!r}", param=name)
    return float(value)


def _check_optional_int(name: str, value: Any, low: int, high: int | None) -> None:
    if value is None:
        return
    if not _is_int(value):
        raise RequestError(f"{name} must be an integer or null, got {value!r}", param=name)
    if value < low or (high is not None and value > high):
        bounds = f">= {low}" if high is None else f"between {low} and {high}"
        raise RequestError(f"{name} must be {bounds}, got {value}", param=name)


def _normalise_stop(value: Any, name: str = "stop") -> tuple[str, ...]:
    if value is None:
        return ()
    items = (value,) if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)):
        raise RequestError(f"{name} must be a string or a list of strings, got {value!r}", param=name)
    if len(items) > MAX_STOP_STRINGS:
        raise RequestError(f"{name} may hold at most {MAX_STOP_STRINGS} strings, got {len(items)}", param=name)
    for item in items:
        if not isinstance(item, str):
            raise RequestError(f"{name} strings must be strings, got {item!r}", param=name)
        if not item:
            raise RequestError(f"{name} strings must not be empty", param=name)
        if len(item) > MAX_STOP_LENGTH:
            raise RequestError(
                f"{name} strings may be at most {MAX_STOP_LENGTH} characters, got {len(item)}", param=name)
    return tuple(items)


def _normalise_stop_token_ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if not isinstance(value, (list, tuple)):
        raise RequestError(
            f"stop_token_ids must be a list of integers, got {value!r}", param="stop_token_ids"
        )
    for item in value:
        if not _is_int(item) or item < 0:
            raise RequestError(
                f"stop_token_ids must hold non-negative integers, got {item!r}",
                param="stop_token_ids",
            )
    return tuple(value)


def _normalise_logit_bias(value: Any) -> tuple[tuple[int, float], ...]:
    """A mapping (token id, or its decimal string, as OpenAI's JSON keys are) -> bias, or pairs:
    sorted (id, bias) pairs. Ids are checked against the vocabulary by the engine."""
    if value is None:
        return ()
    items = value.items() if isinstance(value, Mapping) else value
    if not isinstance(items, (list, tuple)) and not isinstance(value, Mapping):
        raise RequestError(f"logit_bias must be an object of token id -> bias, got {value!r}",
                           param="logit_bias")
    out: dict[int, float] = {}
    for pair in items:
        key, bias = pair
        token = key
        if isinstance(key, str):
            if not key.strip().lstrip("-").isdigit():
                raise RequestError(f"logit_bias keys must be token ids, got {key!r}", param="logit_bias")
            token = int(key)
        if not _is_int(token) or token < 0:
            raise RequestError(f"logit_bias keys must be non-negative token ids, got {key!r}",
                               param="logit_bias")
        bias = _check_float("logit_bias", bias)
        if not -MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS:
            raise RequestError(f"logit_bias values must be between -{MAX_LOGIT_BIAS:g} and "
                               f"{MAX_LOGIT_BIAS:g}, got {bias:g} for token {token}", param="logit_bias")
        out[token] = bias
    if len(out) > MAX_LOGIT_BIAS_TOKENS:
        raise RequestError(f"logit_bias may name at most {MAX_LOGIT_BIAS_TOKENS} tokens, got {len(out)}",
                           param="logit_bias")
    return tuple(sorted(out.items()))


@dataclass(frozen=True)
class SamplingParams:
    # None: until EOS or the context is full; else at least 1 new token.
    max_tokens: int | None = None
    # 0 (or below GREEDY_TEMPERATURE) is greedy; at most MAX_TEMPERATURE.
    temperature: float = 1.0
    # 0 is off (-1 is accepted and becomes 0); else keep the k most likely tokens.
    top_k: int = 0
    # Nucleus: keep the smallest set of most likely tokens whose mass reaches top_p.
    top_p: float = 1.0
    # Drop tokens whose probability is below min_p times the most likely token's.
    min_p: float = 0.0
    # None: unseeded; any int otherwise (reduced modulo 2**64 by `make_generator`).
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    # None: no logprobs; else the chosen token's logprob plus this many alternatives.
    logprobs: int | None = None
    # OpenAI's penalties on the logits of tokens already in the output: minus
    # frequency_penalty per occurrence, minus presence_penalty once if present.
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    # The repetition penalty (HF, vLLM; llama.cpp's repeat_penalty) of tokens in the prompt and
    # output: a positive logit divided by it, a negative one multiplied; 1 is off.
    repetition_penalty: float = 1.0
    # The tokens it looks back over: 0 or None: the whole prompt and output (vLLM); N: the last N
    # (llama.cpp's repeat_last_n).
    repeat_last_n: int | None = None
    # Token id -> a value added to its logit ({id: -100} bans it); a mapping or pairs.
    logit_bias: Any = ()
    # End-of-sequence and stop_token_ids cannot be chosen before this many new tokens.
    min_tokens: int = 0
    # A compiled grammar the output must match (strata.grammar.CompiledGrammar), or None.
    grammar: Any = None
    # The output text leaves special tokens out (vLLM's field); False where a tool-call format
    # marks calls with them (Llama's <|python_tag|>, Mistral's [TOOL_CALLS]).
    skip_special_tokens: bool = True
    # The names errors give the fields, where the caller's API spells them otherwise
    # (e.g. {"max_tokens": "max_completion_tokens"}, or a command line's flags)
    field_names: InitVar[Mapping[str, str] | None] = None

    def __post_init__(self, field_names: Mapping[str, str] | None) -> None:
        names = field_names or {}
        _check_optional_int(names.get("max_tokens", "max_tokens"), self.max_tokens, 1, None)

        temperature = _check_float("temperature", self.temperature)
        if not 0.0 <= temperature <= MAX_TEMPERATURE:
            raise RequestError(
                f"temperature must be between 0 and {MAX_TEMPERATURE:g}, got {temperature:g}",
                param="temperature",
            )
        object.__setattr__(self, "temperature", temperature)

        if not _is_int(self.top_k):
            raise RequestError(f"top_k must be an integer, got {self.top_k!r}", param="top_k")
        if self.top_k < -1:
            raise RequestError(
                f"top_k must be -1 or 0 (off) or at least 1, got {self.top_k}", param="top_k"
            )
        object.__setattr__(self, "top_k", max(self.top_k, 0))

        top_p = _check_float("top_p", self.top_p)
        if not 0.0 < top_p <= 1.0:
            raise RequestError(f"top_p must be in (0, 1], got {top_p:g}", param="top_p")
        object.__setattr__(self, "top_p", top_p)

        min_p = _check_float("min_p", self.min_p)
        if not 0.0 <= min_p <= 1.0:
            raise RequestError(f"min_p must be in [0, 1], got {min_p:g}", param="min_p")
        object.__setattr__(self, "min_p", min_p)

        if self.seed is not None and not _is_int(self.seed):
            raise RequestError(f"seed must be an integer or null, got {self.seed!r}", param="seed")

        object.__setattr__(self, "stop", _normalise_stop(self.stop, names.get("stop", "stop")))
        object.__setattr__(self, "stop_token_ids", _normalise_stop_token_ids(self.stop_token_ids))

        if not isinstance(self.ignore_eos, bool):
            raise RequestError(
                f"ignore_eos must be a boolean, got {self.ignore_eos!r}", param="ignore_eos"
            )

        _check_optional_int("logprobs", self.logprobs, 0, MAX_LOGPROBS)
        if not isinstance(self.skip_special_tokens, bool):
            raise RequestError(f"skip_special_tokens must be a boolean, got {self.skip_special_tokens!r}",
                               param="skip_special_tokens")

        for name in ("presence_penalty", "frequency_penalty"):
            value = _check_float(names.get(name, name), getattr(self, name))
            if not -MAX_PENALTY <= value <= MAX_PENALTY:
                raise RequestError(f"{names.get(name, name)} must be between -{MAX_PENALTY:g} and "
                                   f"{MAX_PENALTY:g}, got {value:g}", param=names.get(name, name))
            object.__setattr__(self, name, value)
        rep_name = names.get("repetition_penalty", "repetition_penalty")
        rep = _check_float(rep_name, self.repetition_penalty)
        if not 0.0 < rep <= MAX_REPETITION_PENALTY:
            raise RequestError(f"{rep_name} must be in (0, {MAX_REPETITION_PENALTY:g}], got {rep:g}",
                               param=rep_name)
        object.__setattr__(self, "repetition_penalty", rep)
        _check_optional_int(names.get("repeat_last_n", "repeat_last_n"), self.repeat_last_n, 0, None)
        object.__setattr__(self, "logit_bias", _normalise_logit_bias(self.logit_bias))
        _check_optional_int(names.get("min_tokens", "min_tokens"), self.min_tokens, 0, None)
        if self.min_tokens is None:
            object.__setattr__(self, "min_tokens", 0)
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise RequestError(f"min_tokens ({self.min_tokens}) must not exceed "
                               f"{names.get('max_tokens', 'max_tokens')} ({self.max_tokens})",
                               param=names.get("min_tokens", "min_tokens"))

    @property
    def has_logit_controls(self) -> bool:
        """Anything that changes the logits before sampling (penalties, bias, min_tokens, a grammar)."""
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0
                    or self.logit_bias or self.min_tokens or self.grammar is not None)

    @property
    def is_greedy(self) -> bool:
        """Argmax decoding: temperature (near) 0, or top_k 1 (the same token set)."""
        return self.temperature < GREEDY_TEMPERATURE or self.top_k == 1
