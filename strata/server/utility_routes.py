"""Small endpoints users script against, in llama.cpp's and vLLM's shapes (one body answers both):

- POST /tokenize: `content` (llama.cpp) or `prompt` (vLLM) text, or `messages` (vLLM: the chat
  template's prompt) -> `tokens` (ids, or {id, piece} with `with_pieces`), `count`, `max_model_len`;
- POST /detokenize: `tokens` -> `content` (llama.cpp) and `prompt` (vLLM);
- POST /apply-template: `messages` (with `tools`, `chat_template_kwargs`) -> `prompt`, the text
  /v1/chat/completions would feed the model;
- GET /props: the model, context, lanes, pool, chat template and build (llama.cpp's names where
  it has them).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool

from strata import __version__
from strata.errors import RequestError
from strata.server.params import ModelInfo, chat_text
from strata.server.requests import ChatMessage, StrictModel
from strata.server.routes import ERRORS, state_of
from strata.server.tools.choice import check_tools
from strata.server.tools.prompt import check_template_kwargs

router = APIRouter()


class TokenizeRequest(StrictModel):
    content: str | None = Field(None, description="llama.cpp: the text")
    prompt: str | None = Field(None, description="vLLM: the text")
    messages: list[ChatMessage] | None = Field(None, description="vLLM: a chat, through the template")
    model: str | None = None
    add_special: bool | None = Field(None, description="llama.cpp: add BOS where the model wants it")
    add_special_tokens: bool | None = Field(None, description="vLLM: the same")
    add_generation_prompt: bool | None = Field(None, description="with messages: default true")
    with_pieces: bool | None = Field(None, description="llama.cpp: each token's text too")
    return_token_strs: bool | None = Field(None, description="vLLM: token_strs beside tokens")
    tools: list[dict[str, Any]] | None = None
    chat_template_kwargs: dict[str, Any] | None = None


class Piece(BaseModel):
    id: int
    piece: str


class TokenizeResponse(BaseModel):
    tokens: list[int] | list[Piece]
    count: int
    max_model_len: int
    token_strs: list[str] | None = None


class DetokenizeRequest(StrictModel):
    tokens: list[int]
    model: str | None = None


class DetokenizeResponse(BaseModel):
    content: str
    prompt: str


class ApplyTemplateRequest(StrictModel):
    messages: list[ChatMessage]
    model: str | None = None
    tools: list[dict[str, Any]] | None = None
    chat_template_kwargs: dict[str, Any] | None = None


class ApplyTemplateResponse(BaseModel):
    prompt: str


class Props(BaseModel):
    model: str
    model_name: str = Field(..., description="the model's own name (GGUF general.name)")
    n_ctx: int = Field(..., description="cells per conversation (--max-context)")
    total_slots: int = Field(..., description="lanes: the main session and the batch slots")
    vocab_size: int
    chunk_size: int = Field(..., description="cells per chunk (--kv-chunk)")
    kv_layout: str = Field(..., description="pooled (--kv-pool-tokens) or reserved")
    kv_chunks_total: int | None = None
    kv_chunks_free: int | None = None
    chat_template: str | None
    tool_call_parser: str
    reasoning_format: str
    build_info: str
    fingerprint: str


def _check_model(info: ModelInfo, model: str | None) -> None:
    from strata.server.errors import ModelNotFound

    if model is not None and model != info.model_id:
        raise ModelNotFound(model, info.model_id)


def _chat(info: ModelInfo, messages: list[ChatMessage], tools: Any, kwargs: Any,
          add_generation_prompt: bool = True) -> tuple[list[int], str]:
    if not messages:
        raise RequestError("messages must not be empty", param="messages")
    setup = check_tools(tools, None, None, info.tool_format())
    dumped = [m.model_dump(exclude_none=True) for m in messages]
    return chat_text(dumped, setup, check_template_kwargs(kwargs), info, add_generation_prompt)


def _tokenize(body: TokenizeRequest, info: ModelInfo) -> TokenizeResponse:
    _check_model(info, body.model)
    given = [k for k in ("content", "prompt", "messages") if getattr(body, k) is not None]
    if len(given) != 1:
        raise RequestError("give one of content, prompt or messages", param="content")
    tok = info.tokenizer
    if body.messages is not None:
        ids, _ = _chat(info, body.messages, body.tools, body.chat_template_kwargs,
                       body.add_generation_prompt is not False)
    else:
        add = body.add_special if body.add_special is not None else body.add_special_tokens
        ids = tok.encode(body.content if body.content is not None else body.prompt, add_special_tokens=bool(
            True if add is None else add))
    pieces = [tok.decode([i]) for i in ids] if (body.with_pieces or body.return_token_strs) else None
    tokens: list = [Piece(id=i, piece=p) for i, p in zip(ids, pieces)] if body.with_pieces else ids
    return TokenizeResponse(tokens=tokens, count=len(ids), max_model_len=info.max_context,
                            token_strs=pieces if body.return_token_strs else None)


@router.post("/tokenize", response_model=TokenizeResponse, response_model_exclude_none=True, responses=ERRORS)
async def tokenize(body: TokenizeRequest, request: Request) -> TokenizeResponse:
    info = state_of(request).loop.check_ready()
    return await run_in_threadpool(_tokenize, body, info)


@router.post("/detokenize", response_model=DetokenizeResponse, responses=ERRORS)
async def detokenize(body: DetokenizeRequest, request: Request) -> DetokenizeResponse:
    info = state_of(request).loop.check_ready()
    _check_model(info, body.model)
    bad = [t for t in body.tokens if not 0 <= t < info.vocab_size]
    if bad:
        raise RequestError(f"tokens: {bad[0]} is not a token id below the vocabulary size {info.vocab_size}",
                           param="tokens")
    text = info.tokenizer.decode(body.tokens)
    return DetokenizeResponse(content=text, prompt=text)


@router.post("/apply-template", response_model=ApplyTemplateResponse, responses=ERRORS)
async def apply_template(body: ApplyTemplateRequest, request: Request) -> ApplyTemplateResponse:
    """The prompt text /v1/chat/completions would feed the model for these messages."""
    info = state_of(request).loop.check_ready()
    _check_model(info, body.model)
    _, text = await run_in_threadpool(_chat, info, body.messages, body.tools, body.chat_template_kwargs)
    return ApplyTemplateResponse(prompt=text)


@router.get("/props", response_model=Props, responses=ERRORS)
async def props(request: Request) -> Props:
    state = state_of(request)
    info = state.loop.check_ready()
    engine = state.loop.engine_info
    snap = state.loop.snapshot
    return Props(
        model=info.model_id, model_name=engine.model_name, n_ctx=info.max_context, total_slots=engine.num_lanes,
        vocab_size=info.vocab_size, chunk_size=engine.chunk_size, kv_layout=engine.layout,
        kv_chunks_total=snap.pool.num_chunks_total if snap is not None else None,
        kv_chunks_free=snap.pool.num_chunks_free if snap is not None else None,
        chat_template=info.tokenizer.chat_template, tool_call_parser=info.tool_format().name,
        reasoning_format=info.reasoning_format, build_info=f"strata {__version__}", fingerprint=info.fingerprint,
    )
