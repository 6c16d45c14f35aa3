"""From a validated Messages request to what the engine runs: prompt token ids +
SamplingParams. Everything here raises `RequestError` naming the field (a 400); it runs off
the engine thread (tokenizing is thread-safe)."""

from __future__ import annotations

from typing import Any

from strata.errors import RequestError
from strata.sampling import SamplingParams
from strata.server.anthropic.requests import (
    NEUTRAL_ONLY,
    Block,
    CountTokensRequest,
    Message,
    MessagesRequest,
    TextBlock,
)
from strata.server.errors import ModelNotFound
from strata.server.params import Job, ModelInfo, _check_max_tokens, checked

DEFAULT_TEMPERATURE = 1.0  # Anthropic's default


def _refuse_unsupported(req: MessagesRequest | CountTokensRequest) -> None:
    for name, (what, neutral) in NEUTRAL_ONLY.items():
        value = getattr(req, name)
        if value is not None and value not in neutral:
            raise RequestError(
                f"{name}: {what} is not supported by this server", param=name,
                code="unsupported_parameter",
            )


def _text_of(blocks: list[Block] | list[TextBlock], where: str) -> list[dict[str, str]]:
    parts = []
    for j, block in enumerate(blocks):
        if block.type != "text":
            raise RequestError(
                f"{where}[{j}]: content blocks of type {block.type!r} are not supported by "
                "this server (text only)",
                param=f"{where}[{j}].type", code="unsupported_parameter",
            )
        if block.text is None:
            raise RequestError(f"{where}[{j}].text is required", param=f"{where}[{j}].text")
        if block.model_extra:
            unknown = min(block.model_extra)
            raise RequestError(
                f"{where}[{j}]: unknown field {unknown!r} in a text block",
                param=f"{where}[{j}].{unknown}",
            )
        parts.append({"type": "text", "text": block.text})
    return parts


def _content(message: Message, where: str) -> str | list[dict[str, str]]:
    if isinstance(message.content, str):
        return message.content
    return _text_of(message.content, f"{where}.content")


def _plain_text(content: str | list[dict[str, str]]) -> str:
    return content if isinstance(content, str) else "\n".join(p["text"] for p in content)


def prompt_ids(req: MessagesRequest | CountTokensRequest, info: ModelInfo) -> list[int]:
    """The prompt: the chat template over system + messages; a last assistant message is a
    prefill the answer continues (its text follows the generation prompt, unterminated)."""
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
        chat.append({"role": message.role, "content": _content(message, f"messages[{i}]")})
    prefill = None
    if req.messages[-1].role == "assistant":
        prefill = _plain_text(chat.pop()["content"])
        if prefill != prefill.rstrip():
            raise RequestError(
                "the final assistant message cannot end with trailing whitespace",
                param=f"messages[{len(req.messages) - 1}].content",
            )
    ids = info.tokenizer.encode_chat(chat)
    if prefill:
        ids += info.tokenizer.encode(prefill, add_special_tokens=False)
    return ids


def messages_job(req: MessagesRequest, info: ModelInfo) -> Job:
    _check_max_tokens(req.max_tokens, "max_tokens", info)  # ranges: the request model's
    ids = prompt_ids(req, info)
    prompt = checked(ids, info, "messages")
    params = SamplingParams(
        max_tokens=req.max_tokens,
        temperature=DEFAULT_TEMPERATURE if req.temperature is None else req.temperature,
        top_k=0 if req.top_k is None else req.top_k,
        top_p=1.0 if req.top_p is None else req.top_p,
        stop=req.stop_sequences,
        field_names={"stop": "stop_sequences"},  # the field the client actually sent
    )
    return Job(prompt, params, bool(req.stream), include_usage=True, want_logprobs=False)
