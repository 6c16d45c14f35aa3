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
  stream_options.include_usage, logprobs, top_logprobs, n (choices of one prompt, prefilled
  once; seeds seed + i), presence_penalty, frequency_penalty, logit_bias, response_format
  (text, json_object, json_schema), tools, tool_choice (none, auto, required, a named
  function), parallel_tool_calls; and the extensions of vLLM and llama.cpp: top_k, min_p,
  stop_token_ids, ignore_eos, min_tokens, repetition_penalty, repeat_penalty, repeat_last_n,
  skip_special_tokens, structured_outputs, guided_json, guided_regex, guided_choice,
  guided_grammar, json_schema, grammar (GBNF), chat_template_kwargs.
- Accepted only at their neutral value, anything else is a 400 `unsupported_parameter`:
  best_of (1, or n), store (false), echo (false), suffix ("" or null).
- Accepted and ignored on purpose (metadata that does not change the output): user,
  metadata, service_tier.
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


class JsonSchemaSpec(StrictModel):
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | bool | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(StrictModel):
    type: str = Field(..., description="text, json_object or json_schema")
    json_schema: JsonSchemaSpec | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema", description="llama.cpp: json_object's schema")


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
    n: int | None = Field(None, description="choices of the one prompt (1 to 16)")
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    frequency_penalty: float | None = Field(None, description="-2..2, per occurrence in the output")
    presence_penalty: float | None = Field(None, description="-2..2, once per token in the output")
    repetition_penalty: float | None = Field(None, description="extension (vLLM): (0, 2], 1 is off")
    repeat_penalty: float | None = Field(None, description="extension (llama.cpp): as repetition_penalty, "
                                         "over the last repeat_last_n tokens")
    repeat_last_n: int | None = Field(None, description="extension (llama.cpp): default 64; 0: the whole context")
    min_tokens: int | None = Field(None, description="extension (vLLM): no end before this many tokens")
    logit_bias: dict[str, float] | None = Field(None, description="token id -> bias in [-100, 100]")
    skip_special_tokens: bool | None = Field(None, description="extension (vLLM): default true")
    user: str | None = Field(None, description="accepted and ignored")
    structured_outputs: dict[str, Any] | None = Field(
        None, description="extension (vLLM): one of json, regex, choice, grammar, json_object")
    guided_json: dict[str, Any] | str | None = Field(None, description="extension (vLLM)")
    guided_regex: str | None = Field(None, description="extension (vLLM)")
    guided_choice: list[str] | None = Field(None, description="extension (vLLM)")
    guided_grammar: str | None = Field(None, description="extension (vLLM): Lark, or GBNF")
    json_schema: dict[str, Any] | None = Field(None, description="extension (llama.cpp)")
    grammar: str | None = Field(None, description="extension (llama.cpp): a GBNF grammar")


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
    tools: list[dict[str, Any]] | None = Field(None, description="function tools")
    tool_choice: str | dict[str, Any] | None = Field(
        None, description="'none', 'auto' (default with tools), 'required' or a named function"
    )
    parallel_tool_calls: bool | None = Field(None, description="several calls in one answer (default true)")
    response_format: ResponseFormat | None = Field(None, description="text, json_object or json_schema")
    chat_template_kwargs: dict[str, Any] | None = Field(
        None, description="extension (vLLM): extra variables for the chat template (enable_thinking, ...)")
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
    best_of: int | None = Field(None, description="only 1, or equal to n")
