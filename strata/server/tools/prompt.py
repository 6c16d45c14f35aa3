"""A conversation with tools rendered by the model's own chat template, as transformers does:
`tools` (OpenAI's shape) is a template variable, assistant turns keep their `tool_calls` (their
`arguments` as objects, as templates read them), `tool` turns pass through.

A template that never reads `tools` (the default model's) would drop them silently: for it the
tools go into the system turn in Hermes's words (Qwen2.5's template text), assistant calls
become `<tool_call>` blocks and tool results `<tool_response>` blocks in a user turn, so that
the model sees what a Hermes-style template would have shown it.
"""

from __future__ import annotations

import json
import re
from typing import Any

from strata.errors import RequestError
from strata.server.tools.choice import ToolSetup

READS_TOOLS = re.compile(r"\btools\b")
# the variables the server sets, and the template's own globals
RESERVED = ("messages", "tools", "add_generation_prompt", "bos_token", "eos_token", "raise_exception",
            "strftime_now", "namespace")
HERMES_TOOLS = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{tools}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
)


def template_reads_tools(template: str | None) -> bool:
    return bool(template and READS_TOOLS.search(template))


def check_template_kwargs(value: dict[str, Any] | None, param: str = "chat_template_kwargs") -> dict[str, Any]:
    if not value:
        return {}
    for key in value:
        if key in RESERVED or key.startswith("_"):
            raise RequestError(f"{param}.{key} cannot be set here (the server sets it)", param=f"{param}.{key}")
    return dict(value)


def with_tools(messages: list[dict[str, Any]], setup: ToolSetup | None, template: str | None
               ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(messages, extra template variables) for rendering `messages` with `setup`'s tools."""
    if template_reads_tools(template):
        out = [_arguments_as_objects(m) for m in messages]
        return out, ({"tools": [t.as_template() for t in setup.tools]} if setup is not None else {})
    has_tool_turns = any(m.get("role") == "tool" or m.get("tool_calls") for m in messages)
    if setup is None and not has_tool_turns:
        return messages, {}
    out = [_hermes_turn(m) for m in messages]
    if setup is not None:
        block = HERMES_TOOLS.format(tools="\n".join(json.dumps(t.as_template(), ensure_ascii=False)
                                                    for t in setup.tools))
        if out and out[0]["role"] in ("system", "developer"):
            out[0] = {**out[0], "content": f"{_text(out[0].get('content'))}\n\n{block}".lstrip()}
        else:
            out.insert(0, {"role": "system", "content": block})
    return out, {}


def _arguments_as_objects(message: dict[str, Any]) -> dict[str, Any]:
    calls = message.get("tool_calls")
    if not calls:
        return message
    fixed = []
    for call in calls:
        function = dict(call.get("function") or {}) if isinstance(call, dict) else {}
        if isinstance(function.get("arguments"), str):
            try:
                function["arguments"] = json.loads(function["arguments"])
            except ValueError:
                pass
        fixed.append({**call, "function": function} if isinstance(call, dict) else call)
    return {**message, "tool_calls": fixed}


def _hermes_turn(message: dict[str, Any]) -> dict[str, Any]:
    role = message.get("role")
    if role == "tool":
        return {"role": "user", "content": f"<tool_response>\n{_text(message.get('content'))}\n</tool_response>"}
    calls = message.get("tool_calls")
    if role == "assistant" and calls:
        blocks = []
        for call in calls:
            function = call.get("function") if isinstance(call, dict) else None
            if not isinstance(function, dict):
                raise RequestError("an assistant tool call needs a 'function' object", param="messages")
            args = function.get("arguments", {})
            if isinstance(args, str):
                try:
                    args = json.loads(args)
                except ValueError:
                    pass
            body = json.dumps({"name": function.get("name"), "arguments": args}, ensure_ascii=False)
            blocks.append(f"<tool_call>\n{body}\n</tool_call>")
        text = _text(message.get("content"))
        return {"role": "assistant", "content": "\n".join(([text] if text else []) + blocks)}
    return {k: v for k, v in message.items() if k not in ("tool_calls", "tool_call_id")}


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return str(content)
