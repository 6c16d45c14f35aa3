"""A tool call as the answer carries it, and reading one from the JSON a model wrote."""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from typing import Any


def new_call_id() -> str:
    return f"call_{secrets.token_hex(12)}"


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # a JSON object's text, as OpenAI sends `function.arguments`
    id: str = field(default_factory=new_call_id)

    @property
    def input(self) -> dict[str, Any]:
        """The arguments as an object (Anthropic's `tool_use.input`)."""
        value = json.loads(self.arguments)
        return value if isinstance(value, dict) else {}

    def as_openai(self, index: int | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"id": self.id, "type": "function",
                                "function": {"name": self.name, "arguments": self.arguments}}
        return body if index is None else {"index": index, **body}


def call_from_object(value: Any, args_keys: tuple[str, ...] = ("arguments", "parameters")) -> ToolCall | None:
    """{"name": str, "arguments" (or "parameters"): object or JSON text} -> a ToolCall; None otherwise."""
    if not isinstance(value, dict) or not isinstance(value.get("name"), str) or not value["name"]:
        return None
    args: Any = {}
    for key in args_keys:
        if key in value:
            args = value[key]
            break
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    return ToolCall(value["name"], json.dumps(args, ensure_ascii=False))


def calls_from_json(text: str, args_keys: tuple[str, ...] = ("arguments", "parameters")) -> list[ToolCall] | None:
    """A JSON object or a list of them, each a call; None when `text` is anything else."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    items = value if isinstance(value, list) else [value]
    calls = [call_from_object(v, args_keys) for v in items]
    if not calls or any(c is None for c in calls):
        return None
    return calls  # type: ignore[return-value]
