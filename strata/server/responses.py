"""Response bodies, in OpenAI's shapes plus strata's additions.

Additions (ignored by clients that do not know them):
- `truncated` on a choice: true when the KV pool could not grow the answer (then
  `finish_reason` is "length"); in a stream it rides on the final chunk only.
- `timings`: llama.cpp's names (cache_n, prompt_n, prompt_ms, prompt_per_second,
  predicted_n, predicted_ms, predicted_per_second); in a stream, on the final chunk.
- `usage.prompt_tokens_details.cached_tokens`: prompt tokens whose K/V were reused.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


def _absent_if_none(value: object) -> bool:
    return value is None


class PromptTokensDetails(BaseModel):
    cached_tokens: int


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class Timings(BaseModel):
    cache_n: int
    prompt_n: int
    prompt_ms: float
    prompt_per_second: float
    predicted_n: int
    predicted_ms: float
    predicted_per_second: float
    # with --spec: drafts proposed and kept for this request (llama.cpp's names)
    draft_n: int | None = Field(None, exclude_if=_absent_if_none)
    draft_n_accepted: int | None = Field(None, exclude_if=_absent_if_none)


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[TokenLogprob]


class CompletionLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]


# ---- chat ----------------------------------------------------------------------------------


class FunctionCall(BaseModel):
    name: str
    arguments: str  # a JSON object's text


class ToolCallOut(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    # A reasoning model's thinking (vLLM's and llama.cpp's name), absent when there is none
    reasoning_content: str | None = Field(None, exclude_if=_absent_if_none)
    tool_calls: list[ToolCallOut] | None = Field(None, exclude_if=_absent_if_none)


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str
    truncated: bool = False


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    system_fingerprint: str | None = None
    choices: list[ChatChoice]
    usage: Usage
    timings: Timings | None = None


class FunctionCallDelta(BaseModel):
    name: str | None = Field(None, exclude_if=_absent_if_none)
    arguments: str | None = Field(None, exclude_if=_absent_if_none)


class ToolCallDelta(BaseModel):
    index: int
    id: str | None = Field(None, exclude_if=_absent_if_none)
    type: Literal["function"] | None = Field(None, exclude_if=_absent_if_none)
    function: FunctionCallDelta


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = Field(None, exclude_if=_absent_if_none)
    content: str | None = Field(None, exclude_if=_absent_if_none)
    reasoning_content: str | None = Field(None, exclude_if=_absent_if_none)
    tool_calls: list[ToolCallDelta] | None = Field(None, exclude_if=_absent_if_none)


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: ChatDelta
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    truncated: bool | None = Field(None, exclude_if=_absent_if_none)


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    system_fingerprint: str | None = None
    choices: list[ChatChunkChoice]
    # With stream_options.include_usage: null on every chunk but the last, which has no choices.
    usage: Usage | None = Field(None, exclude_if=_absent_if_none)
    timings: Timings | None = Field(None, exclude_if=_absent_if_none)


# ---- completions ---------------------------------------------------------------------------


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    truncated: bool | None = Field(None, exclude_if=_absent_if_none)


class Completion(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    system_fingerprint: str | None = None
    choices: list[CompletionChoice]
    usage: Usage | None = Field(None, exclude_if=_absent_if_none)
    timings: Timings | None = Field(None, exclude_if=_absent_if_none)


# ---- the rest ------------------------------------------------------------------------------


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "strata"
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class Health(BaseModel):
    status: Literal["ok"]


class SlotRing(BaseModel):
    ring_cells: int = Field(..., description="cells per layer this lane keeps on the device (--kv-resident)")
    resident_pages: int = Field(..., description="pages of its conversation resident after the last step")
    pages_read: int
    pages_streamed: int = Field(..., description="pages copied from the pool (staged or admitted)")
    hit_ratio: float = Field(..., description="pages read in place / pages read")


class SlotSpec(BaseModel):
    drafted: int = Field(..., description="draft tokens proposed for the running request")
    accepted: int = Field(..., description="... and kept by its verify steps")
    acceptance: float
    k: int = Field(..., description="drafts the lane proposes next step (adaptive, 0: none)")


class SlotMoE(BaseModel):
    expert_slots: int = Field(..., description="expert slots per MoE layer now (--moe-resident, --device-memory)")
    hit_ratio: float = Field(..., description="expert runs from a slot / expert runs, every lane since start")
    bytes_copied_per_token: float = Field(..., description="expert bytes copied per token computed")
    budget_ring_cells: int | None = Field(None, description="with --device-memory: the ring the budget granted "
                                                            "this lane's request (none while it holds none)")


class SlotWindowGroup(BaseModel):
    window: int = Field(..., description="the cells this group's layers read behind each token")
    layers: int = Field(..., description="the layers of the group (its chunks hold K/V of these only)")
    chunks_held: int = Field(..., description="chunks of the group's own pool the lane's conversation holds")
    chunks_kept: int = Field(..., description="of those, the chunks held only for kept windows (behind the "
                                              "window of the next token: where a branch goes on from)")
    kept_windows: int = Field(..., description="positions (checkpoints, prompts' ends) whose window before "
                                               "them the lane's conversation keeps")
    group_chunks_total: int = Field(..., description="the group's whole pool, every lane's (as "
                                                     "strata_kv_window_chunks{state=\"total\"})")
    group_chunks_free: int = Field(..., description="of the group's pool, the chunks no conversation holds")


class Slot(BaseModel):
    id: int
    state: Literal["empty", "idle", "prefilling", "decoding"]
    n_ctx: int
    conversation_tokens: int = Field(..., description="cells of the lane's conversation")
    chunks_held: int
    chunks_shared: int = Field(0, description="of the chunks held, those shared with other conversations")
    request_id: str | None = None
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    ring: SlotRing | None = Field(None, description="with --kv-resident: the lane's ring, for its last request")
    spec: SlotSpec | None = Field(None, description="with --spec: the running request's drafts")
    moe: SlotMoE | None = Field(None, description="with the expert cache: the shared cache and this lane's "
                                                  "share of the device budget")
    window_groups: list[SlotWindowGroup] | None = Field(
        None, exclude_if=_absent_if_none, description="sliding-window layer groups in a pool: each group's chunks (chunks_held is the full group's)")


class ErrorBody(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None
    retry_after: int | None = Field(None, exclude_if=_absent_if_none)
    # On a 500: the incident id the server log files the details under.
    id: str | None = Field(None, exclude_if=_absent_if_none)


class ErrorResponse(BaseModel):
    error: ErrorBody
