"""The request body of POST /v1/responses (OpenAI's Responses API), as typed pydantic models.

Honoured: model, input (a string, or message / function_call / function_call_output items),
instructions, max_output_tokens, temperature, top_p, stream, tools (function tools),
tool_choice, parallel_tool_calls, previous_response_id, store, text.format (text,
json_object, json_schema), metadata and user (kept, they do not change the output),
truncation ("disabled"). Refused by name (a 400): built-in tools (web_search, file_search,
code_interpreter, computer use, image generation, mcp, ...), input images, files and audio,
reasoning effort, include, background, prompt templates, conversation objects.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from strata.server.requests import StrictModel


class TextFormat(StrictModel):
    type: str = Field(..., description="text, json_object or json_schema")
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class TextOptions(StrictModel):
    format: TextFormat | None = None
    verbosity: Literal["medium"] | None = Field(None, description="only medium")


class ResponsesRequest(StrictModel):
    model: str | None = Field(None, description="the served model id; omitted: that model")
    input: str | list[dict[str, Any]] = Field(..., description="text, or message and function call items")
    instructions: str | None = Field(None, description="a system message for this response only")
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = None
    top_p: float | None = None
    stream: bool | None = False
    tools: list[dict[str, Any]] | None = Field(None, description="function tools only")
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    previous_response_id: str | None = Field(None, description="continue a stored response's conversation")
    store: bool | None = Field(None, description="keep the response for previous_response_id (default true)")
    text: TextOptions | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    truncation: Literal["disabled"] | None = Field(None, description="only disabled")
    reasoning: dict[str, Any] | None = Field(None, description="only null or {}")
    include: list[str] | None = Field(None, description="only empty")
    background: bool | None = Field(None, description="only false")
    top_logprobs: int | None = Field(None, description="only 0")
    service_tier: str | None = Field(None, description="accepted and ignored")
