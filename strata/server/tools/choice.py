"""A request's tools and tool_choice, checked, and the grammar that makes a call certain.

- `none`: the tools are not shown to the model and no call is read from the answer;
- `auto` (the default with tools): the model decides; calls are read from its answer;
- `required`, or a named function: the answer is one call (one or more when
  `parallel_tool_calls` is sent as true: small models go on calling while they may) in the
  template's format, through a grammar whose arguments follow each tool's `parameters`
  schema, so the calls always parse and validate.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from strata.errors import RequestError
from strata.grammar.compiler import JSON_WHITESPACE
from strata.server.tools.parsers import ToolFormat

NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")  # OpenAI's rule for function names (plus . and :)


@dataclass(frozen=True)
class Tool:
    name: str
    description: str | None
    parameters: dict[str, Any]

    def as_template(self) -> dict[str, Any]:
        """The shape chat templates read (transformers passes OpenAI's)."""
        function: dict[str, Any] = {"name": self.name, "parameters": self.parameters}
        if self.description is not None:
            function["description"] = self.description
        return {"type": "function", "function": function}


@dataclass(frozen=True)
class ToolSetup:
    tools: tuple[Tool, ...]
    choice: str  # "auto" | "required" | "named"
    named: str | None  # the function tool_choice names
    parallel: bool  # several calls may be read from one answer (parallel_tool_calls, default true)
    fmt: ToolFormat
    many_forced: bool = False  # a forced answer may hold several calls (parallel_tool_calls: true, explicitly)

    @property
    def forced(self) -> tuple[Tool, ...]:
        """The tools a grammar holds the answer to (none for `auto`)."""
        if self.choice == "named":
            return tuple(t for t in self.tools if t.name == self.named)
        return self.tools if self.choice == "required" else ()


def check_tools(tools: list[dict[str, Any]] | None, tool_choice: Any, parallel: bool | None,
                fmt: ToolFormat, prefix: str = "") -> ToolSetup | None:
    """None when the answer is plain text (no tools, or tool_choice "none")."""
    checked = tuple(_tool(t, f"{prefix}tools[{i}]") for i, t in enumerate(tools or []))
    names = [t.name for t in checked]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise RequestError(f"{prefix}tools: the function name {dup!r} is given twice", param=f"{prefix}tools")
    param = f"{prefix}tool_choice"
    named = None
    if tool_choice is None:
        choice = "auto"
    elif tool_choice in ("none", "auto", "required"):
        choice = tool_choice
    elif isinstance(tool_choice, dict) and tool_choice.get("type") == "function":
        function = tool_choice.get("function")
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) or set(function) != {"name"}:
            raise RequestError(f"{param} must be {{'type': 'function', 'function': {{'name': ...}}}}", param=param)
        choice, named = "named", function["name"]
        if set(tool_choice) != {"type", "function"}:
            raise RequestError(f"{param}: unknown field beside 'type' and 'function'", param=param)
        if named not in names:
            raise RequestError(f"{param} names the function {named!r}, which tools does not list", param=param)
    else:
        raise RequestError(f"{param} must be 'none', 'auto', 'required' or a named function, got {tool_choice!r}",
                           param=param)
    if choice == "required" and not checked:
        raise RequestError(f"{param} 'required' needs tools", param=param)
    if not checked or choice == "none":
        return None
    return ToolSetup(checked, choice, named, True if parallel is None else parallel, fmt, parallel is True)


def _tool(value: Any, where: str) -> Tool:
    if not isinstance(value, dict) or value.get("type") != "function":
        kind = value.get("type") if isinstance(value, dict) else type(value).__name__
        raise RequestError(f"{where}: only function tools are supported, got type {kind!r}",
                           param=f"{where}.type", code="unsupported_parameter")
    unknown = set(value) - {"type", "function"}
    if unknown:
        raise RequestError(f"{where}: unknown field {min(unknown)!r}", param=f"{where}.{min(unknown)}")
    function = value.get("function")
    if not isinstance(function, dict):
        raise RequestError(f"{where}.function must be an object", param=f"{where}.function")
    unknown = set(function) - {"name", "description", "parameters", "strict"}
    if unknown:
        raise RequestError(f"{where}.function: unknown field {min(unknown)!r}",
                           param=f"{where}.function.{min(unknown)}")
    name = function.get("name")
    if not isinstance(name, str) or not NAME.match(name):
        raise RequestError(f"{where}.function.name must be 1-64 letters, digits, '_', '-', '.' or ':', "
                           f"got {name!r}", param=f"{where}.function.name")
    description = function.get("description")
    if description is not None and not isinstance(description, str):
        raise RequestError(f"{where}.function.description must be a string", param=f"{where}.function.description")
    parameters = function.get("parameters", {"type": "object", "properties": {}})
    if not isinstance(parameters, dict):
        raise RequestError(f"{where}.function.parameters must be a JSON schema object",
                           param=f"{where}.function.parameters")
    if function.get("strict") not in (None, True, False):
        raise RequestError(f"{where}.function.strict must be a boolean", param=f"{where}.function.strict")
    return Tool(name, description, parameters)


def call_schema(tool: Tool, args_key: str) -> dict[str, Any]:
    params = tool.parameters or {"type": "object"}
    return {"type": "object", "properties": {"name": {"const": tool.name}, args_key: params},
            "required": ["name", args_key], "additionalProperties": False}


def _bounded(schema: dict[str, Any]) -> str:
    """An inline `%json` schema whose whitespace between JSON tokens is bounded as a response
    format's is (llguidance's default inside Lark is unbounded: a weak model could pad a forced
    call with blank lines until max_tokens and never finish it)."""
    return json.dumps({**schema, "x-guidance": {"whitespace_pattern": JSON_WHITESPACE}})


def forced_grammar(setup: ToolSetup, special_id: int | None) -> str:
    """A Lark grammar (llguidance's, with inline `%json`) of the calls `setup` forces.
    `special_id`: the token id of the format's marker where it is a special token."""
    tools = setup.forced
    assert tools
    fmt = setup.fmt
    if fmt.name == "mistral":
        one = {"anyOf": [call_schema(t, "arguments") for t in tools]}
        array = {"type": "array", "items": one, "minItems": 1}
        if not setup.many_forced:
            array["maxItems"] = 1
        marker = f"<[{special_id}]>" if special_id is not None else json.dumps(fmt.start)
        return f"start: {marker} %json {_bounded(array)}"
    if fmt.name == "llama3_json":
        one = _bounded({"anyOf": [call_schema(t, "parameters") for t in tools]})
        more = ' ("; " call)*' if setup.many_forced else ""
        return f"start: call{more}\ncall: %json {one}"
    one = _bounded({"anyOf": [call_schema(t, "arguments") for t in tools]})
    more = ' ("\\n" call)*' if setup.many_forced else ""
    return f'start: call{more}\ncall: "<tool_call>\\n" %json {one} "\\n</tool_call>"'
