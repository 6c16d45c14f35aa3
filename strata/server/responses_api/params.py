"""From a Responses request to a chat Job: input items -> chat messages (after the stored
conversation of previous_response_id), text.format -> a grammar, function tools -> the chat
tools. Refusals name the field; runs off the engine thread."""

from __future__ import annotations

import json
from typing import Any

from strata.errors import RequestError
from strata.server.constraints import _from_response_format
from strata.server.params import DEFAULT_TEMPERATURE, Job, ModelInfo, _check_max_tokens, answer_shape, chat_prompt
from strata.server.errors import ModelNotFound
from strata.sampling import SamplingParams
from strata.server.requests import JsonSchemaSpec, ResponseFormat
from strata.server.responses_api.requests import ResponsesRequest
from strata.server.responses_api.store import ResponseStore
from strata.server.tools.choice import check_tools, forced_grammar
from strata.server.tools.prompt import check_template_kwargs

BUILT_IN = ("web_search", "web_search_preview", "file_search", "code_interpreter", "computer_use_preview",
            "computer_use", "image_generation", "mcp", "local_shell", "shell", "custom", "apply_patch")
INPUT_PARTS = ("input_text", "output_text", "text")


def _unsupported(param: str, what: str) -> RequestError:
    return RequestError(f"{param}: {what} is not supported by this server", param=param, code="unsupported_parameter")


def _text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise RequestError(f"{where} must be a string or a list of parts", param=where)
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in INPUT_PARTS:
            raise _unsupported(f"{where}[{j}].type", f"input of type {kind!r} (text only)")
        if not isinstance(part.get("text"), str):
            raise RequestError(f"{where}[{j}].text must be a string", param=f"{where}[{j}].text")
        texts.append(part["text"])
    return "\n".join(texts)


def input_messages(items: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Responses input -> chat messages (OpenAI chat's shapes, tool calls included)."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    out: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        where = f"input[{i}]"
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise RequestError(f"{where}.role must be user, assistant, system or developer, got {role!r}",
                                   param=f"{where}.role")
            out.append({"role": role, "content": _text(item.get("content"), f"{where}.content")})
        elif kind == "function_call":
            for key in ("call_id", "name", "arguments"):
                if not isinstance(item.get(key), str):
                    raise RequestError(f"{where}.{key} must be a string", param=f"{where}.{key}")
            call = {"id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": item["arguments"]}}
            if out and out[-1]["role"] == "assistant" and out[-1].get("tool_calls") is not None:
                out[-1]["tool_calls"].append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            if not isinstance(item.get("call_id"), str) or output is None:
                raise RequestError(f"{where} needs call_id and output", param=where)
            out.append({"role": "tool", "tool_call_id": item["call_id"],
                        "content": output if isinstance(output, str) else json.dumps(output)})
        elif kind == "reasoning":
            continue  # a previous answer's thinking: not shown to the model again (as OpenAI does)
        else:
            raise _unsupported(f"{where}.type", f"input items of type {kind!r}")
    if not out:
        raise RequestError("input must hold at least one message", param="input")
    return [{k: v for k, v in m.items() if v is not None or k == "content"} for m in out]


def _chat_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    if tools is None:
        return None
    out = []
    for i, tool in enumerate(tools):
        kind = tool.get("type")
        if kind in BUILT_IN or kind != "function":
            raise _unsupported(f"tools[{i}].type", f"the built-in tool {kind!r} (function tools only)")
        function = {k: v for k, v in tool.items() if k in ("name", "description", "parameters", "strict")}
        extra = set(tool) - {"type", "name", "description", "parameters", "strict"}
        if extra:
            raise RequestError(f"tools[{i}]: unknown field {min(extra)!r}", param=f"tools[{i}].{min(extra)}")
        out.append({"type": "function", "function": function})
    return out


def _chat_tool_choice(choice: Any) -> Any:
    if isinstance(choice, dict):
        if choice.get("type") != "function" or set(choice) != {"type", "name"}:
            raise _unsupported("tool_choice", f"tool_choice {choice!r} (none, auto, required or a function)")
        return {"type": "function", "function": {"name": choice["name"]}}
    return choice


def responses_job(req: ResponsesRequest, info: ModelInfo, store: ResponseStore) -> tuple[Job, list[dict[str, Any]]]:
    """The chat Job, and the conversation (without instructions) a stored response continues."""
    if req.model is not None and req.model != info.model_id:
        raise ModelNotFound(req.model, info.model_id)
    if req.reasoning:
        raise _unsupported("reasoning", "reasoning options")
    if req.include:
        raise _unsupported("include", f"include {req.include!r}")
    if req.background:
        raise _unsupported("background", "background responses")
    if req.top_logprobs:
        raise _unsupported("top_logprobs", "logprobs")
    _check_max_tokens(req.max_output_tokens, "max_output_tokens", info)
    history = store.conversation(req.previous_response_id) if req.previous_response_id else []
    conversation = history + input_messages(req.input)
    messages = ([{"role": "system", "content": req.instructions}] if req.instructions else []) + conversation
    fmt = info.tool_format()
    tools = check_tools(_chat_tools(req.tools), _chat_tool_choice(req.tool_choice), req.parallel_tool_calls, fmt)
    grammar = None
    text_format = req.text.format if req.text is not None else None
    if text_format is not None:
        spec = JsonSchemaSpec(name=text_format.name, schema=text_format.schema_, strict=text_format.strict)
        as_chat = ResponseFormat(type=text_format.type, json_schema=spec if text_format.type == "json_schema" else None)
        try:
            grammar = _from_response_format(as_chat, info.grammars)
        except RequestError as exc:  # named in chat's words: say text.format's
            message = str(exc).replace("response_format.json_schema.schema", "text.format.schema")
            raise RequestError(message.replace("response_format", "text.format"), param="text.format",
                               code=exc.code) from None
    if tools is not None and tools.forced:
        if grammar is not None:
            raise RequestError("tool_choice: a forced tool call and text.format cannot both hold the answer",
                               param="tool_choice")
        grammar = info.grammars.compile("lark", forced_grammar(tools, None), "tools")
    prompt, text = chat_prompt(messages, tools, check_template_kwargs(None), info, "input")
    params = SamplingParams(
        max_tokens=req.max_output_tokens,
        temperature=DEFAULT_TEMPERATURE if req.temperature is None else req.temperature,
        top_p=1.0 if req.top_p is None else req.top_p,
        grammar=grammar,
        skip_special_tokens=not (tools is not None and fmt.special_markers),
        field_names={"max_tokens": "max_output_tokens"},
    )
    job = Job(prompt, params, bool(req.stream), include_usage=True, want_logprobs=False,
              shape=answer_shape(info, text, tools), tools=tools)
    return job, conversation
