"""From a validated request body to what the engine runs: prompt token ids + SamplingParams.

Everything here raises `RequestError` naming the field (a 400); nothing here touches the
engine's mutable state, so it runs off the engine thread (tokenizing is thread-safe).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from strata.engine.interface import Prompt, check_prompt
from strata.errors import RequestError
from strata.loader.tokenizer import Tokenizer
from strata.sampling import MAX_LOGPROBS, SamplingParams
from strata.server.errors import ModelNotFound
from strata.server.requests import ChatCompletionRequest, CompletionRequest, _Sampling

SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1
DEFAULT_TEMPERATURE = 1.0  # OpenAI's default


@dataclass(frozen=True)
class ModelInfo:
    """What the edge needs to know about the loaded model (immutable after loading)."""

    model_id: str
    tokenizer: Tokenizer
    max_context: int
    vocab_size: int
    fingerprint: str


@dataclass(frozen=True)
class Job:
    """One generation, ready for the engine loop."""

    prompt: Prompt
    params: SamplingParams
    stream: bool
    include_usage: bool
    want_logprobs: bool


def _unsupported(param: str, what: str) -> RequestError:
    return RequestError(
        f"{param}: {what} is not supported by this server",
        code="unsupported_parameter",
        param=param,
    )


def _check_common(req: _Sampling, info: ModelInfo) -> None:
    if req.model is not None and req.model != info.model_id:
        raise ModelNotFound(req.model, info.model_id)
    if req.n is not None and req.n != 1:
        if req.n < 1:
            raise RequestError(f"n must be 1, got {req.n}", param="n")
        raise _unsupported("n", f"n={req.n} (several choices per request)")
    for name in ("frequency_penalty", "presence_penalty"):
        value = getattr(req, name)
        if value not in (None, 0, 0.0):
            raise _unsupported(name, f"a non-zero {name}")
    if req.logit_bias:
        raise _unsupported("logit_bias", "a non-empty logit_bias")
    if req.stream_options is not None and not req.stream:
        raise RequestError(
            "stream_options is only allowed when stream is true", param="stream_options"
        )
    if req.seed is not None and not SEED_MIN <= req.seed <= SEED_MAX:
        raise RequestError(
            f"seed must be between {SEED_MIN} and {SEED_MAX}, got {req.seed}", param="seed"
        )


def _check_max_tokens(value: int | None, param: str, info: ModelInfo) -> None:
    # A value no conversation could ever reach is a mistake, not a wish (OpenAI rejects it too).
    if value is not None and value > info.max_context:
        raise RequestError(
            f"{param} must be at most the context length {info.max_context}, got {value}",
            param=param,
        )


def _sampling(
    req: _Sampling, max_tokens: int | None, max_tokens_param: str, logprobs: int | None
) -> SamplingParams:
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=DEFAULT_TEMPERATURE if req.temperature is None else req.temperature,
        top_k=0 if req.top_k is None else req.top_k,
        top_p=1.0 if req.top_p is None else req.top_p,
        min_p=0.0 if req.min_p is None else req.min_p,
        seed=req.seed,
        stop=req.stop,
        stop_token_ids=req.stop_token_ids,
        ignore_eos=bool(req.ignore_eos),
        logprobs=logprobs,
        field_names={"max_tokens": max_tokens_param},  # the field the client actually sent
    )


def checked(prompt_ids: list[int], info: ModelInfo, param: str) -> Prompt:
    """The prompt checked once, here at the edge (the engine takes it as it is)."""
    return check_prompt(prompt_ids, info.max_context, info.vocab_size, param)


def chat_job(req: ChatCompletionRequest, info: ModelInfo) -> Job:
    _check_common(req, info)
    if (
        req.max_tokens is not None
        and req.max_completion_tokens is not None
        and req.max_tokens != req.max_completion_tokens
    ):
        raise RequestError(
            "max_tokens and max_completion_tokens disagree; send one of them",
            param="max_completion_tokens",
        )
    param = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
    max_tokens = (
        req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    )
    _check_max_tokens(max_tokens, param, info)
    if req.top_logprobs is not None and not req.logprobs:
        raise RequestError("top_logprobs needs logprobs to be true", param="top_logprobs")
    if req.top_logprobs is not None and not 0 <= req.top_logprobs <= MAX_LOGPROBS:
        raise RequestError(
            f"top_logprobs must be between 0 and {MAX_LOGPROBS}, got {req.top_logprobs}",
            param="top_logprobs",
        )
    if req.tools:
        raise _unsupported("tools", "tool calling")
    if req.tool_choice not in (None, "none", "auto"):
        raise _unsupported("tool_choice", f"tool_choice {req.tool_choice!r}")
    if req.response_format is not None and (
        req.response_format.type != "text" or req.response_format.json_schema
    ):
        raise _unsupported(
            "response_format", f"response_format type {req.response_format.type!r} (only 'text')"
        )
    if req.store:
        raise _unsupported("store", "storing completions")
    logprobs = (req.top_logprobs or 0) if req.logprobs else None
    params = _sampling(req, max_tokens, param, logprobs)
    messages: list[dict[str, Any]] = [m.model_dump(exclude_none=True) for m in req.messages]
    prompt = checked(info.tokenizer.encode_chat(messages), info, "messages")
    return Job(prompt, params, bool(req.stream), _include_usage(req), logprobs is not None)


def completion_job(req: CompletionRequest, info: ModelInfo) -> Job:
    _check_common(req, info)
    _check_max_tokens(req.max_tokens, "max_tokens", info)
    if req.echo:
        raise _unsupported("echo", "echoing the prompt")
    if req.suffix:
        raise _unsupported("suffix", "a suffix (fill-in-the-middle)")
    if req.best_of not in (None, 1):
        raise _unsupported("best_of", f"best_of={req.best_of}")
    if req.logprobs is not None and not 0 <= req.logprobs <= MAX_LOGPROBS:
        raise RequestError(
            f"logprobs must be between 0 and {MAX_LOGPROBS}, got {req.logprobs}", param="logprobs"
        )
    params = _sampling(req, req.max_tokens, "max_tokens", req.logprobs)
    prompt = checked(_prompt_ids(req.prompt, info), info, "prompt")
    return Job(prompt, params, bool(req.stream), _include_usage(req), req.logprobs is not None)


def _prompt_ids(prompt: str | list, info: ModelInfo) -> list[int]:
    if isinstance(prompt, str):
        return info.tokenizer.encode(prompt)
    if prompt and not isinstance(prompt[0], int):  # a batch of prompts
        if len(prompt) != 1:
            raise _unsupported(
                "prompt", f"a batch of {len(prompt)} prompts (send one prompt per request)"
            )
        return _prompt_ids(prompt[0], info)
    return list(prompt)


def _include_usage(req: _Sampling) -> bool:
    return bool(req.stream_options is not None and req.stream_options.include_usage)
