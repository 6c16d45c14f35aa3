"""Anthropic's tools on the chat machinery: `tools` (custom tools: name, description,
input_schema), `tool_choice` (auto, any, tool, none; disable_parallel_tool_use), `tool_use`
blocks in assistant turns and `tool_result` blocks in user turns, as OpenAI-shaped chat
messages that the chat template renders. Server tools (bash, web search, ...) are refused by name."""

from __future__ import annotations

import json
from typing import Any

from strata.errors import RequestError


def _unsupported(param: str, what: str) -> RequestError:
    return RequestError(f"{param}: {what} is not supported by this server", param=param, code="unsupported_parameter")


def chat_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    if not tools:
        return None
    out = []
    for i, tool in enumerate(tools):
        kind = tool.get("type", "custom")
        if kind != "custom":
            raise _unsupported(f"tools[{i}].type", f"the server tool {kind!r} (custom tools only)")
        extra = set(tool) - {"type", "name", "description", "input_schema", "cache_control"}
        if extra:
            raise RequestError(f"tools[{i}]: unknown field {min(extra)!r}", param=f"tools[{i}].{min(extra)}")
        if "input_schema" not in tool:
            raise RequestError(f"tools[{i}].input_schema is required", param=f"tools[{i}].input_schema")
        function = {"name": tool.get("name"), "parameters": tool["input_schema"]}
        if tool.get("description") is not None:
            function["description"] = tool["description"]
        out.append({"type": "function", "function": function})
    return out


def chat_tool_choice(choice: dict[str, Any] | None) -> tuple[Any, bool | None]:
    """(OpenAI's tool_choice, parallel_tool_calls) for Anthropic's tool_choice."""
    if choice is None:
        return None, None
    kind = choice.get("type")
    extra = set(choice) - {"type", "name", "disable_parallel_tool_use"}
    if extra:
        raise RequestError(f"tool_choice: unknown field {min(extra)!r}", param=f"tool_choice.{min(extra)}")
    parallel = None if choice.get("disable_parallel_tool_use") is None else not choice["disable_parallel_tool_use"]
    if kind == "auto":
        return "auto", parallel
    if kind == "any":
        return "required", parallel
    if kind == "none":
        return "none", parallel
    if kind == "tool":
        if not isinstance(choice.get("name"), str):
            raise RequestError("tool_choice.name is required with type 'tool'", param="tool_choice.name")
        return {"type": "function", "function": {"name": choice["name"]}}, parallel
    raise RequestError(f"tool_choice.type must be auto, any, tool or none, got {kind!r}", param="tool_choice.type")


def _result_text(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise _unsupported(f"{where}[{j}]", "tool results other than text")
            texts.append(part["text"])
        return "\n".join(texts)
    raise RequestError(f"{where} must be a string or text blocks", param=where)


def turn_messages(role: str, blocks: list[Any], where: str) -> list[dict[str, Any]]:
    """One Anthropic turn's blocks -> chat messages (text, tool calls, tool results)."""
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    for j, block in enumerate(blocks):
        b = block.model_dump(exclude_none=True) if hasattr(block, "model_dump") else dict(block)
        kind, at = b.get("type"), f"{where}[{j}]"
        if kind == "text":
            if not isinstance(b.get("text"), str):
                raise RequestError(f"{at}.text is required", param=f"{at}.text")
            unknown = set(b) - {"type", "text", "cache_control", "citations"}
            if unknown:
                raise RequestError(f"{at}: unknown field {min(unknown)!r} in a text block", param=f"{at}.{min(unknown)}")
            texts.append(b["text"])
        elif kind == "tool_use" and role == "assistant":
            if not isinstance(b.get("id"), str) or not isinstance(b.get("name"), str) or not isinstance(b.get("input"), dict):
                raise RequestError(f"{at}: a tool_use block needs id, name and input", param=at)
            calls.append({"id": b["id"], "type": "function",
                          "function": {"name": b["name"], "arguments": json.dumps(b["input"])}})
        elif kind == "tool_result" and role == "user":
            if not isinstance(b.get("tool_use_id"), str):
                raise RequestError(f"{at}.tool_use_id is required", param=f"{at}.tool_use_id")
            text = _result_text(b.get("content"), f"{at}.content")
            if b.get("is_error"):
                text = f"Error: {text}"
            results.append({"role": "tool", "tool_call_id": b["tool_use_id"], "content": text})
        elif kind in ("thinking", "redacted_thinking") and role == "assistant":
            continue  # earlier thinking is not shown to the model again
        else:
            raise _unsupported(f"{at}.type", f"content blocks of type {kind!r} in a {role} turn")
    out: list[dict[str, Any]] = list(results)
    if calls:
        out.append({"role": role, "content": "\n".join(texts) or None, "tool_calls": calls})
    elif texts or not results:
        out.append({"role": role, "content": "\n".join(texts)})
    return out
