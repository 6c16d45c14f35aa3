"""From a validated Messages request to what the engine runs: prompt token ids +
SamplingParams. Everything here raises `RequestError` naming the field (a 400); it runs off
the engine thread (tokenizing is thread-safe)."""

from __future__ import annotations

from typing import Any

from strata.errors import RequestError
from strata.sampling import SamplingParams
from strata.server.anthropic.requests import (
    Block,
    CountTokensRequest,
    Message,
    MessagesRequest,
    TextBlock,
)
from strata.server.errors import ModelNotFound
from strata.server.anthropic.tools import chat_tool_choice, chat_tools, turn_messages
from strata.server.params import Job, ModelInfo, _check_max_tokens, answer_shape, chat_text, checked
from strata.server.tools.choice import ToolSetup, check_tools, forced_grammar

DEFAULT_TEMPERATURE = 1.0  # Anthropic's default


def _refuse_unsupported(req: MessagesRequest | CountTokensRequest) -> None:
    thinking = req.thinking
    if thinking is not None and thinking.get("type") not in ("enabled", "disabled"):
        raise RequestError("thinking.type must be 'enabled' or 'disabled'", param="thinking.type")


def _text_of(blocks: list[Block] | list[TextBlock], where: str) -> list[dict[str, str]]:
    parts = []
    for j, block in enumerate(blocks):
        if block.type != "text":
            raise RequestError(
                f"{where}[{j}]: content blocks of type {block.type!r} are not supported here (text only)",
                param=f"{where}[{j}].type", code="unsupported_parameter",
            )
        if block.text is None:
            raise RequestError(f"{where}[{j}].text is required", param=f"{where}[{j}].text")
        parts.append({"type": "text", "text": block.text})
    return parts


def _chat(req: MessagesRequest | CountTokensRequest, info: ModelInfo) -> tuple[list[dict[str, Any]], str | None]:
    """(chat messages, the prefill a last assistant message asks the answer to continue)."""
    if req.model != info.model_id:
        raise ModelNotFound(req.model, info.model_id)
    _refuse_unsupported(req)
    if req.messages[0].role != "user":
        raise RequestError("messages[0].role must be 'user'", param="messages[0].role")
    chat: list[dict[str, Any]] = []
    if req.system is not None:
        system = req.system if isinstance(req.system, str) else _text_of(req.system, "system")
        chat.append({"role": "system", "content": system})
    for i, message in enumerate(req.messages):
        if isinstance(message.content, str):
            chat.append({"role": message.role, "content": message.content})
        else:
            chat += turn_messages(message.role, message.content, f"messages[{i}].content")
    prefill = None
    last = chat[-1]
    if req.messages[-1].role == "assistant" and not last.get("tool_calls"):
        prefill = chat.pop()["content"] or ""
        if prefill != prefill.rstrip():
            raise RequestError(
                "the final assistant message cannot end with trailing whitespace",
                param=f"messages[{len(req.messages) - 1}].content",
            )
    return chat, prefill


def _tools(req: MessagesRequest | CountTokensRequest, info: ModelInfo) -> ToolSetup | None:
    choice, parallel = chat_tool_choice(req.tool_choice)
    return check_tools(chat_tools(req.tools), choice, parallel, info.tool_format())


def _prompt(req: MessagesRequest | CountTokensRequest, info: ModelInfo) -> tuple[list[int], str, ToolSetup | None]:
    chat, prefill = _chat(req, info)
    tools = _tools(req, info)
    kwargs = {"enable_thinking": req.thinking.get("type") == "enabled"} if req.thinking else {}
    ids, text = chat_text(chat, tools, kwargs, info)
    if prefill:
        ids += info.tokenizer.encode(prefill, add_special_tokens=False)
    return ids, text, tools


def prompt_ids(req: MessagesRequest | CountTokensRequest, info: ModelInfo) -> list[int]:
    """The prompt: the chat template over system + messages (+ tools); a last assistant message
    is a prefill the answer continues (its text follows the generation prompt, unterminated)."""
    return _prompt(req, info)[0]


def messages_job(req: MessagesRequest, info: ModelInfo) -> Job:
    _check_max_tokens(req.max_tokens, "max_tokens", info)  # ranges: the request model's
    ids, text, tools = _prompt(req, info)
    prompt = checked(ids, info, "messages")
    fmt = info.tool_format()
    grammar = None
    if tools is not None and tools.forced:
        grammar = info.grammars.compile("lark", forced_grammar(tools, None), "tools")
    params = SamplingParams(
        max_tokens=req.max_tokens,
        temperature=DEFAULT_TEMPERATURE if req.temperature is None else req.temperature,
        top_k=0 if req.top_k is None else req.top_k,
        top_p=1.0 if req.top_p is None else req.top_p,
        stop=req.stop_sequences,
        grammar=grammar,
        skip_special_tokens=not (tools is not None and fmt.special_markers),
        field_names={"stop": "stop_sequences"},  # the field the client actually sent
    )
    return Job(prompt, params, bool(req.stream), include_usage=True, want_logprobs=False,
               shape=answer_shape(info, text, tools), tools=tools)
