"""Engine outputs -> Anthropic Messages bodies: the whole message, and the stream's events in
Anthropic's order: message_start, content_block_start, (ping)*, content_block_delta*,
content_block_stop, message_delta (stop_reason, cumulative usage), message_stop."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel

from strata.engine.interface import RequestOutput


class TextContent(BaseModel):
    type: Literal["text"] = "text"
    text: str


class Usage(BaseModel):
    """input_tokens: prompt tokens read afresh; cache_read_input_tokens: reused from the
    conversation cache (their sum is the prompt, as in Anthropic's accounting)."""

    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0


StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "model_context_window_exceeded"]


class MessageBody(BaseModel):
    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    content: list[TextContent]
    model: str
    stop_reason: StopReason | None
    stop_sequence: str | None
    usage: Usage


class ErrorObject(BaseModel):
    type: str
    message: str


class ErrorBody(BaseModel):
    type: Literal["error"] = "error"
    error: ErrorObject


class TokenCount(BaseModel):
    input_tokens: int


def usage_of(num_prompt: int, num_cached: int, num_output: int) -> Usage:
    return Usage(
        input_tokens=num_prompt - num_cached,
        output_tokens=num_output,
        cache_read_input_tokens=num_cached,
    )


def stop_of(out: RequestOutput, max_tokens: int) -> tuple[StopReason, str | None]:
    """(stop_reason, stop_sequence) of a finished output."""
    if out.stop_string is not None:
        return "stop_sequence", out.stop_string
    if out.finish_reason == "length":
        if out.num_output_tokens >= max_tokens:
            return "max_tokens", None
        return "model_context_window_exceeded", None  # the context or the KV pool is full
    return "end_turn", None


class MessageFormat:
    """One response: its id and model; builds the whole body or each stream event."""

    def __init__(self, request_id: str, model: str, max_tokens: int, num_prompt: int):
        self.id = f"msg_{request_id}"
        self.model, self.max_tokens, self.num_prompt = model, max_tokens, num_prompt

    def message(self, text: str, out: RequestOutput) -> MessageBody:
        reason, sequence = stop_of(out, self.max_tokens)
        return MessageBody(
            id=self.id,
            content=[TextContent(text=text)],
            model=self.model,
            stop_reason=reason,
            stop_sequence=sequence,
            usage=usage_of(out.num_prompt_tokens, out.num_cached_tokens, out.num_output_tokens),
        )

    def opening(self, num_cached: int) -> list[str]:
        """message_start (usage as known at admission) and the text block's start."""
        start = MessageBody(
            id=self.id, content=[], model=self.model, stop_reason=None, stop_sequence=None,
            usage=usage_of(self.num_prompt, num_cached, 0),
        )
        return [
            event("message_start", {"type": "message_start", "message": start.model_dump()}),
            event(
                "content_block_start",
                {"type": "content_block_start", "index": 0,
                 "content_block": {"type": "text", "text": ""}},
            ),
        ]

    def delta(self, out: RequestOutput) -> list[str]:
        text = out.new_text
        if not text:
            return []
        return [event(
            "content_block_delta",
            {"type": "content_block_delta", "index": 0,
             "delta": {"type": "text_delta", "text": text}},
        )]

    def closing(self, out: RequestOutput) -> list[str]:
        reason, sequence = stop_of(out, self.max_tokens)
        usage = usage_of(out.num_prompt_tokens, out.num_cached_tokens, out.num_output_tokens)
        return [
            event("content_block_stop", {"type": "content_block_stop", "index": 0}),
            event(
                "message_delta",
                {"type": "message_delta",
                 "delta": {"stop_reason": reason, "stop_sequence": sequence},
                 "usage": usage.model_dump()},
            ),
            event("message_stop", {"type": "message_stop"}),
        ]


def event(name: str, payload: dict[str, Any]) -> str:
    """One SSE event with Anthropic's `event:` line before its data."""
    return f"event: {name}\ndata: {json.dumps(payload, ensure_ascii=False)}\n\n"


PING = event("ping", {"type": "ping"})
