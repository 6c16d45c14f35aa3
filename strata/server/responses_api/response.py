"""A Responses answer as server/respond.py streams it (`ResponseFormat`): OpenAI's events
(response.created, response.in_progress, output items with their deltas, response.completed),
and the whole `response` object. The answer is read like a chat answer (strata/server/answer.py):
reasoning -> a `reasoning` item, text -> a `message` item with `output_text`, each tool call ->
a `function_call` item. A stored response keeps its conversation for previous_response_id."""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Sequence
from typing import Any

from strata.engine.interface import Collected, RequestOutput
from strata.server.answer import AnswerShape, Parts, read_whole
from strata.server.errors import error_body
from strata.server.responses_api.store import ResponseStore
from strata.server.sse import comment
from strata.server.tools.calls import ToolCall


def _id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


class ResponsesFormat:
    def __init__(self, response_id: str, model: str, shape: AnswerShape, echo: dict[str, Any],
                 conversation: list[dict[str, Any]], store: ResponseStore | None):
        self.id = response_id
        self.created = int(time.time())
        self._model_id, self._shape, self._echo = model, shape, echo
        self._conversation, self._store = conversation, store
        self._reader = shape.reader()
        self._seq = 0
        self._items: list[dict[str, Any]] = []  # output items so far (the open one last)
        self._open: str | None = None  # "reasoning" | "message": the item text is streaming into

    # ---- the object --------------------------------------------------------------------
    def body(self, status: str, final: RequestOutput | None, items: list[dict[str, Any]]) -> dict[str, Any]:
        incomplete = None
        if final is not None and final.finish_reason == "length":
            status, incomplete = "incomplete", {"reason": "max_output_tokens"}
        usage = None
        if final is not None:
            usage = {"input_tokens": final.num_prompt_tokens,
                     "input_tokens_details": {"cached_tokens": final.num_cached_tokens},
                     "output_tokens": final.num_output_tokens, "output_tokens_details": {"reasoning_tokens": 0},
                     "total_tokens": final.num_prompt_tokens + final.num_output_tokens}
        return {"id": self.id, "object": "response", "created_at": self.created, "status": status,
                "model": self._model_id, "output": items, "usage": usage, "error": None,
                "incomplete_details": incomplete, **self._echo}

    def _remember(self, items: list[dict[str, Any]]) -> None:
        if self._store is None:
            return
        text = "".join(p["text"] for i in items if i["type"] == "message" for p in i["content"])
        calls = [{"id": i["call_id"], "type": "function", "function": {"name": i["name"], "arguments": i["arguments"]}}
                 for i in items if i["type"] == "function_call"]
        answer: dict[str, Any] = {"role": "assistant", "content": text or None}
        if calls:
            answer["tool_calls"] = calls
        if not calls:
            answer["content"] = text
        self._store.put(self.id, [*self._conversation, answer])

    @staticmethod
    def _message(text: str) -> dict[str, Any]:
        return {"type": "message", "id": _id("msg"), "status": "completed", "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": []}]}

    @staticmethod
    def _reasoning(text: str) -> dict[str, Any]:
        return {"type": "reasoning", "id": _id("rs"), "summary": [],
                "content": [{"type": "reasoning_text", "text": text}]}

    @staticmethod
    def _call(call: ToolCall) -> dict[str, Any]:
        return {"type": "function_call", "id": _id("fc"), "call_id": call.id, "name": call.name,
                "arguments": call.arguments, "status": "completed"}

    def whole(self, gots: Sequence[Collected]) -> dict:
        got = gots[0]
        parts = read_whole(self._shape, got.text)
        items = ([self._reasoning("".join(parts.reasoning))] if parts.reasoning else [])
        content = "".join(parts.content)
        if content or not parts.calls:
            items.append(self._message(content))
        items += [self._call(c) for c in parts.calls]
        self._remember(items)
        return self.body("completed", got.final, items)

    # ---- the stream --------------------------------------------------------------------
    def _event(self, kind: str, **payload: Any) -> str:
        data = {"type": kind, "sequence_number": self._seq, **payload}
        self._seq += 1
        return f"event: {kind}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"

    def opening(self, first) -> list[str]:
        start = self.body("in_progress", None, [])
        return [self._event("response.created", response=start), self._event("response.in_progress", response=start)]

    def _start(self, kind: str) -> list[str]:
        out = self._close()
        item = self._reasoning("") if kind == "reasoning" else self._message("")
        item["status"] = "in_progress"
        self._items.append(item)
        self._open = kind
        index = len(self._items) - 1
        part = item["content"][0]
        return out + [self._event("response.output_item.added", output_index=index, item=item),
                      self._event("response.content_part.added", output_index=index, item_id=item["id"],
                                  content_index=0, part=dict(part))]

    def _close(self) -> list[str]:
        if self._open is None:
            return []
        index, item = len(self._items) - 1, self._items[-1]
        part = item["content"][0]
        kind = "response.reasoning_text.done" if self._open == "reasoning" else "response.output_text.done"
        self._open = None
        item["status"] = "completed"
        return [self._event(kind, output_index=index, item_id=item["id"], content_index=0, text=part["text"]),
                self._event("response.content_part.done", output_index=index, item_id=item["id"], content_index=0,
                            part=part),
                self._event("response.output_item.done", output_index=index, item=item)]

    def _text(self, kind: str, text: str) -> list[str]:
        out = self._start(kind) if self._open != kind else []
        index, item = len(self._items) - 1, self._items[-1]
        item["content"][0]["text"] += text
        name = "response.reasoning_text.delta" if kind == "reasoning" else "response.output_text.delta"
        return out + [self._event(name, output_index=index, item_id=item["id"], content_index=0, delta=text)]

    def _parts(self, parts: Parts) -> list[str]:
        out: list[str] = []
        for text in parts.reasoning:
            out += self._text("reasoning", text)
        for text in parts.content:
            out += self._text("message", text)
        for call in parts.calls:
            out += self._close()
            item = self._call(call)
            self._items.append(item)
            index = len(self._items) - 1
            out += [self._event("response.output_item.added", output_index=index, item={**item, "arguments": ""}),
                    self._event("response.function_call_arguments.delta", output_index=index, item_id=item["id"],
                                delta=call.arguments),
                    self._event("response.function_call_arguments.done", output_index=index, item_id=item["id"],
                                arguments=call.arguments),
                    self._event("response.output_item.done", output_index=index, item=item)]
        return out

    def delta(self, out: RequestOutput, index: int = 0) -> list[str]:
        events = self._parts(self._reader.feed(out.new_text))
        if out.finished:
            events += self._parts(self._reader.finish())
        return events

    def closing(self, final: RequestOutput, index: int = 0) -> list[str]:
        events = self._close()
        if not self._items:  # an empty answer still has its (empty) message
            events += self._start("message") + self._close()
        return events

    def done(self, finals: Sequence[RequestOutput]) -> list[str]:
        self._remember(self._items)
        body = self.body("completed", finals[0], self._items)
        kind = "response.incomplete" if body["status"] == "incomplete" else "response.completed"
        return [self._event(kind, response=body)]

    def error(self, error: BaseException) -> list[str]:
        return [self._event("error", code=error_body(error).get("code"), message=error_body(error)["message"],
                            param=error_body(error).get("param"))]

    def keepalive(self, admitted: bool) -> str:
        return comment("working" if admitted else "waiting")
