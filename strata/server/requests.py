"""The request bodies of /v1/chat/completions and /v1/completions, as typed pydantic models.

Every field is honoured or rejected, never silently ignored: FIELD_POLICY below is the list
(it is also the API description served at /docs). Value ranges are checked by
`strata.sampling.SamplingParams` and `strata.server.params`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

FIELD_POLICY = """\
- Types are strict (`"1"` is not a number, `true` is not 1); an unknown field is a 400
  `unknown_field` that names it.
- model: the id GET /v1/models lists, or omitted; any other is a 404 `model_not_found`.
- Honoured: messages (chat) or prompt (completions: a string or token ids),
  max_tokens, max_completion_tokens, temperature, top_p, seed, stop, stream,
  stream_options.include_usage, logprobs, top_logprobs; and the common extensions of vLLM
  and llama.cpp: top_k, min_p, stop_token_ids, ignore_eos.
- Accepted only at their neutral value, anything else is a 400 `unsupported_parameter`:
  n (1), best_of (1), frequency_penalty and presence_penalty (0), logit_bias ({}),
  tools ([]), tool_choice ("none", or "auto" with no tools), response_format
  ({"type": "text"}), store (false), echo (false), suffix ("" or null).
- Accepted and ignored on purpose (metadata that does not change the output): user,
  metadata, service_tier, parallel_tool_calls.
- Defaults: temperature 1 (OpenAI's); max tokens: chat until end-of-sequence or the
  context is full, completions 16 (OpenAI's). A max_tokens above the context length is a
  400; a prompt plus max_tokens over it ends with finish_reason "length" at the context.
"""


class StrictModel(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class ChatMessage(StrictModel):
    # 'developer' is OpenAI's newer name for 'system'; 'tool' only where the template has tools.
    role: Literal["system", "developer", "user", "assistant", "tool"]
    # A string, or a list of {"type": "text", "text": ...} parts (checked by the chat template).
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None


class StreamOptions(StrictModel):
    include_usage: bool | None = None


class ResponseFormat(StrictModel):
    type: str
    json_schema: dict[str, Any] | None = None


class _Sampling(StrictModel):
    """Fields both endpoints share."""

    model: str | None = Field(
        None, description="the served model id (GET /v1/models); omitted: that model"
    )
    temperature: float | None = Field(None, description="0 is greedy; default 1")
    top_p: float | None = None
    top_k: int | None = Field(
        None, description="extension (vLLM, llama.cpp): keep the k most likely tokens"
    )
    min_p: float | None = Field(None, description="extension (vLLM, llama.cpp)")
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = Field(None, description="extension (vLLM)")
    ignore_eos: bool | None = Field(
        None, description="extension (vLLM): keep going past end-of-sequence"
    )
    n: int | None = Field(None, description="only 1")
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    frequency_penalty: float | None = Field(None, description="only 0")
    presence_penalty: float | None = Field(None, description="only 0")
    logit_bias: dict[str, float] | None = Field(None, description="only empty")
    user: str | None = Field(None, description="accepted and ignored")


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(..., description="system, user and assistant turns")
    max_tokens: int | None = Field(None, description="deprecated name of max_completion_tokens")
    max_completion_tokens: int | None = Field(
        None, description="new tokens at most; default: until EOS or the context is full"
    )
    logprobs: bool | None = None
    top_logprobs: int | None = Field(
        None, description="0..20 alternatives per token; needs logprobs"
    )
    tools: list[dict[str, Any]] | None = Field(None, description="only empty")
    tool_choice: str | dict[str, Any] | None = Field(
        None, description="only 'none' or 'auto' without tools"
    )
    parallel_tool_calls: bool | None = Field(None, description="accepted and ignored")
    response_format: ResponseFormat | None = Field(None, description="only {'type': 'text'}")
    store: bool | None = Field(None, description="only false")
    metadata: dict[str, str] | None = Field(None, description="accepted and ignored")
    service_tier: str | None = Field(None, description="accepted and ignored")


class CompletionRequest(_Sampling):
    # One prompt: a string or token ids (a list holding one of them is accepted too).
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = Field(
        16, description="new tokens at most (OpenAI's default 16); null: until EOS"
    )
    logprobs: int | None = Field(None, description="0..20 alternatives per token")
    echo: bool | None = Field(None, description="only false")
    suffix: str | None = Field(None, description="only empty")
    best_of: int | None = Field(None, description="only 1")
