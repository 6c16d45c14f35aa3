"""The request body of POST /v1/messages, as typed pydantic models (Anthropic's field names).

Every field is honoured or rejected, never silently ignored; FIELD_POLICY is the list (it is
also the operation's description at /docs).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

FIELD_POLICY = """\
- Types are strict; an unknown field is a 400 `invalid_request_error` that names it.
- model: the id GET /v1/models lists; any other is a 404 `not_found_error`.
- Honoured: max_tokens (required, at least 1), messages (`user`/`assistant`, content a
  string or text blocks; a last `assistant` message is continued, as Anthropic does),
  system (a string or text blocks), stop_sequences (stop_reason `stop_sequence`),
  temperature (0..1, default 1), top_p, top_k, stream.
- Accepted: `cache_control` (top level or on blocks: the conversation cache reuses every
  cached prefix anyway, and `usage.cache_read_input_tokens` says how much), metadata.user_id
  and service_tier (they do not change the output).
- Honoured too: tools (custom tools: name, description, input_schema; server tools are a
  400 naming them), tool_choice (auto, any, tool, none; disable_parallel_tool_use),
  `tool_use` blocks in assistant turns and `tool_result` blocks in user turns; thinking
  (enabled or disabled: passed to the template as enable_thinking; a reasoning model's
  `<think>` block comes back as a `thinking` content block); thinking blocks in the history
  are dropped. Any other content block (images, documents, ...) is a 400.
- usage: input_tokens counts the prompt tokens read afresh, cache_read_input_tokens the
  ones reused from the conversation cache (their sum is the prompt), cache_creation 0.
"""


class StrictModel(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class CacheControl(StrictModel):
    type: Literal["ephemeral"]
    ttl: Literal["5m", "1h"] | None = None


class Block(BaseModel):
    """A content block. Only `text` is served; the others are refused by name in
    `params.py` (so their own fields are not validated here)."""

    model_config = ConfigDict(strict=True, extra="allow")
    type: str
    text: str | None = None
    cache_control: CacheControl | None = None


class TextBlock(StrictModel):
    type: Literal["text"]
    text: str
    cache_control: CacheControl | None = None


class Message(StrictModel):
    role: Literal["user", "assistant"]
    content: str | list[Block]


class Metadata(StrictModel):
    user_id: str | None = None


class MessagesRequest(StrictModel):
    model: str = Field(..., description="the served model id (GET /v1/models)")
    max_tokens: int = Field(..., ge=1, description="new tokens at most (required)")
    messages: list[Message] = Field(
        ..., min_length=1, description="user and assistant turns, the first a user's"
    )
    system: str | list[TextBlock] | None = Field(None, description="the system prompt")
    stop_sequences: list[str] | None = Field(None, description="stop strings (at most 16)")
    stream: bool | None = False
    temperature: float | None = Field(None, ge=0, le=1, description="default 1; 0 is greedy")
    top_p: float | None = Field(None, ge=0, le=1)
    top_k: int | None = Field(None, ge=0, description="0: no top-k")
    metadata: Metadata | None = Field(None, description="accepted and ignored")
    service_tier: Literal["auto", "standard_only"] | None = Field(
        None, description="accepted and ignored"
    )
    cache_control: CacheControl | None = Field(
        None, description="accepted: every prefix is cached anyway"
    )
    tools: list[dict[str, Any]] | None = Field(None, description="custom tools")
    tool_choice: dict[str, Any] | None = Field(None, description="auto, any, tool or none")
    thinking: dict[str, Any] | None = Field(None, description="enabled or disabled")


class CountTokensRequest(StrictModel):
    model: str
    messages: list[Message] = Field(..., min_length=1)
    system: str | list[TextBlock] | None = None
    tools: list[dict[str, Any]] | None = Field(None, description="custom tools")
    tool_choice: dict[str, Any] | None = Field(None, description="auto, any, tool or none")
    thinking: dict[str, Any] | None = Field(None, description="enabled or disabled")
