"""Engine outputs -> Anthropic Messages bodies: the whole message, and the stream's events in
Anthropic's order: message_start, content_block_start, (ping)*, content_block_delta*,
content_block_stop, message_delta (stop_reason, cumulative usage), message_stop."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel

from strata.engine.interface import RequestOutput
from strata.server.answer import AnswerShape, Parts, read_whole
from strata.server.tools.calls import ToolCall


class TextContent(BaseModel):
    type: Literal["text"] = "text"
    text: str


class ThinkingContent(BaseModel):
    type: Literal["thinking"] = "thinking"
    thinking: str
    signature: str = ""  # strata signs nothing: the thinking is sent back as it was


class ToolUseContent(BaseModel):
    type: Literal["tool_use"] = "tool_use"
    id: str
    name: str
    input: dict[str, Any]


class Usage(BaseModel):
    """input_tokens: prompt tokens read afresh; cache_read_input_tokens: reused from the
    conversation cache (their sum is the prompt, as in Anthropic's accounting)."""

    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0


StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "model_context_window_exceeded", "tool_use"]


class MessageBody(BaseModel):
    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    content: list[ThinkingContent | TextContent | ToolUseContent]
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


def stop_of(out: RequestOutput, max_tokens: int, num_calls: int = 0) -> tuple[StopReason, str | None]:
    """(stop_reason, stop_sequence) of a finished output."""
    if num_calls and out.finish_reason == "stop" and out.stop_string is None:
        return "tool_use", None
    if out.stop_string is not None:
        return "stop_sequence", out.stop_string
    if out.finish_reason == "length":
        if out.num_output_tokens >= max_tokens:
            return "max_tokens", None
        return "model_context_window_exceeded", None  # the context or the KV pool is full
    return "end_turn", None


class MessageFormat:
    """One response: its id and model; builds the whole body or each stream event. The answer
    is read into thinking, text and tool_use blocks (strata/server/answer.py)."""

    def __init__(self, request_id: str, model: str, max_tokens: int, num_prompt: int,
                 shape: AnswerShape = AnswerShape()):
        self.id = f"msg_{request_id}"
        self.model, self.max_tokens, self.num_prompt = model, max_tokens, num_prompt
        self._shape = shape
        self._reader = shape.reader()
        self._index = -1  # the open block's index (-1: none yet)
        self._open: str | None = None  # "thinking" | "text": the block text streams into

    def message(self, text: str, out: RequestOutput) -> MessageBody:
        parts = read_whole(self._shape, text)
        content: list = [ThinkingContent(thinking="".join(parts.reasoning))] if parts.reasoning else []
        body = "".join(parts.content)
        if body or not parts.calls:
            content.append(TextContent(text=body))
        content += [ToolUseContent(id=_tool_id(c), name=c.name, input=c.input) for c in parts.calls]
        reason, sequence = stop_of(out, self.max_tokens, len(parts.calls))
        return MessageBody(
            id=self.id,
            content=content,
            model=self.model,
            stop_reason=reason,
            stop_sequence=sequence,
            usage=usage_of(out.num_prompt_tokens, out.num_cached_tokens, out.num_output_tokens),
        )

    def opening(self, num_cached: int, eager_text: bool = False) -> list[str]:
        """message_start (usage as known at admission); with `eager_text` (no tools, no thinking
        markers in the template) the text block's start too, before any text."""
        start = MessageBody(
            id=self.id, content=[], model=self.model, stop_reason=None, stop_sequence=None,
            usage=usage_of(self.num_prompt, num_cached, 0),
        )
        out = [event("message_start", {"type": "message_start", "message": start.model_dump()})]
        return out + (self._start({"type": "text", "text": ""}, "text") if eager_text else [])

    def _start(self, block: dict[str, Any], kind: str | None) -> list[str]:
        out = self._stop()
        self._index += 1
        self._open = kind
        return out + [event("content_block_start", {"type": "content_block_start", "index": self._index,
                                                    "content_block": block})]

    def _stop(self) -> list[str]:
        if self._index < 0 or self._open == "closed":
            return []
        out = []
        if self._open == "thinking":
            out.append(self._delta({"type": "signature_delta", "signature": ""}))
        self._open = "closed"
        return out + [event("content_block_stop", {"type": "content_block_stop", "index": self._index})]

    def _delta(self, delta: dict[str, Any]) -> str:
        return event("content_block_delta", {"type": "content_block_delta", "index": self._index, "delta": delta})

    def delta(self, out: RequestOutput) -> list[str]:
        parts = self._reader.feed(out.new_text)
        events = self._parts(parts)
        if out.finished:
            events += self._parts(self._reader.finish())
        return events

    def _parts(self, parts: Parts) -> list[str]:
        events: list[str] = []
        for text in parts.reasoning:
            if self._open != "thinking":
                events += self._start({"type": "thinking", "thinking": "", "signature": ""}, "thinking")
            events.append(self._delta({"type": "thinking_delta", "thinking": text}))
        for text in parts.content:
            if self._open != "text":
                events += self._start({"type": "text", "text": ""}, "text")
            events.append(self._delta({"type": "text_delta", "text": text}))
        for call in parts.calls:
            events += self._start({"type": "tool_use", "id": _tool_id(call), "name": call.name, "input": {}}, "tool")
            events.append(self._delta({"type": "input_json_delta", "partial_json": call.arguments}))
            events += self._stop()
        return events

    def closing(self, out: RequestOutput) -> list[str]:
        events = [] if self._index >= 0 else self._start({"type": "text", "text": ""}, "text")
        events += self._stop()
        reason, sequence = stop_of(out, self.max_tokens, self._reader.num_calls)
        usage = usage_of(out.num_prompt_tokens, out.num_cached_tokens, out.num_output_tokens)
        return events + [
            event(
                "message_delta",
                {"type": "message_delta",
                 "delta": {"stop_reason": reason, "stop_sequence": sequence},
                 "usage": usage.model_dump()},
            ),
            event("message_stop", {"type": "message_stop"}),
        ]


def _tool_id(call: ToolCall) -> str:
    return "toolu_" + call.id.removeprefix("call_")


def event(name: str, payload: dict[str, Any]) -> str:
    """One SSE event with Anthropic's `event:` line before its data."""
    return f"event: {name}\ndata: {json.dumps(payload, ensure_ascii=False)}\n\n"


PING = event("ping", {"type": "ping"})
