"""Engine outputs -> OpenAI response bodies, for chat and for text completions.

A `Format` is made per request; it knows the response id, the model and how each endpoint
spells a delta, a final chunk, a usage chunk and a whole response. `OpenAIResponse` puts
one in the shape server/respond.py streams (`ResponseFormat`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Protocol

from strata.engine.interface import Collected, RequestOutput
from strata.loader.tokenizer import Tokenizer
from strata.sampler import TokenLogprobs
from strata.server import responses as r
from strata.server.errors import error_body
from strata.server.sse import DONE, comment, data_event


def usage_of(out: RequestOutput) -> r.Usage:
    return r.Usage(
        prompt_tokens=out.num_prompt_tokens,
        completion_tokens=out.num_output_tokens,
        total_tokens=out.num_prompt_tokens + out.num_output_tokens,
        prompt_tokens_details=r.PromptTokensDetails(cached_tokens=out.num_cached_tokens),
    )


def timings_of(out: RequestOutput) -> r.Timings | None:
    return r.Timings(**out.timings.as_dict()) if out.timings is not None else None


class TokenText:
    """Token id -> the text OpenAI shows for it in logprobs (a lone piece of a multi-byte
    character shows as U+FFFD, as in OpenAI's own output; `bytes` is that text's UTF-8)."""

    def __init__(self, tokenizer: Tokenizer):
        self._tokenizer = tokenizer

    def __call__(self, token_id: int) -> str:
        return self._tokenizer.decode([token_id], skip_special_tokens=False)

    def top(self, token_id: int, logprob: float) -> r.TopLogprob:
        text = self(token_id)
        return r.TopLogprob(token=text, logprob=logprob, bytes=list(text.encode("utf-8")))


class Format(Protocol):
    def opening(self) -> list[str]: ...
    def delta(self, text: str, logprobs: Sequence[TokenLogprobs]) -> str | None: ...
    def final(self, out: RequestOutput) -> str: ...
    def usage(self, out: RequestOutput) -> str: ...
    def response(
        self, text: str, logprobs: Sequence[TokenLogprobs], out: RequestOutput
    ) -> r.ChatCompletion | r.Completion: ...


class _Stream:
    """What both formats share: the response id, creation time, model and fingerprint that
    every chunk of one response repeats."""

    id_prefix: str
    chunk_type: type[r.ChatCompletionChunk | r.Completion]

    def __init__(
        self, request_id: str, model: str, fingerprint: str, tokens: TokenText, want_logprobs: bool
    ):
        self.id = f"{self.id_prefix}-{request_id}"
        self.created = int(time.time())
        self.model, self.fingerprint = model, fingerprint
        self._tokens, self._want_logprobs = tokens, want_logprobs

    def _body(self, body_type: type, choices: list, **extra):
        return body_type(
            id=self.id,
            created=self.created,
            model=self.model,
            system_fingerprint=self.fingerprint,
            choices=choices,
            **extra,
        )

    def _chunk(self, choices: list, **extra) -> str:
        return self._body(self.chunk_type, choices, **extra).model_dump_json()

    def usage(self, out: RequestOutput) -> str:
        return self._chunk([], usage=usage_of(out))


class ChatFormat(_Stream):
    id_prefix, chunk_type = "chatcmpl", r.ChatCompletionChunk

    def _logprobs(self, logprobs: Sequence[TokenLogprobs]) -> r.ChatLogprobs | None:
        if not self._want_logprobs:
            return None
        content = []
        for lp in logprobs:
            chosen = self._tokens.top(lp.token_id, lp.logprob)
            top = [self._tokens.top(t, v) for t, v in lp.top]
            content.append(r.TokenLogprob(**chosen.model_dump(), top_logprobs=top))
        return r.ChatLogprobs(content=content)

    def opening(self) -> list[str]:
        return [self._chunk([r.ChatChunkChoice(delta=r.ChatDelta(role="assistant", content=""))])]

    def delta(self, text: str, logprobs: Sequence[TokenLogprobs]) -> str | None:
        if not text and not (self._want_logprobs and logprobs):
            return None
        return self._chunk(
            [r.ChatChunkChoice(delta=r.ChatDelta(content=text), logprobs=self._logprobs(logprobs))]
        )

    def final(self, out: RequestOutput) -> str:
        choice = r.ChatChunkChoice(
            delta=r.ChatDelta(), finish_reason=out.finish_reason, truncated=out.truncated
        )
        return self._chunk([choice], timings=timings_of(out))

    def response(
        self, text: str, logprobs: Sequence[TokenLogprobs], out: RequestOutput
    ) -> r.ChatCompletion:
        choice = r.ChatChoice(
            message=r.AssistantMessage(content=text),
            logprobs=self._logprobs(logprobs),
            finish_reason=out.finish_reason or "stop",
            truncated=out.truncated,
        )
        return self._body(r.ChatCompletion, [choice], usage=usage_of(out), timings=timings_of(out))


class CompletionFormat(_Stream):
    id_prefix, chunk_type = "cmpl", r.Completion

    def __init__(
        self, request_id: str, model: str, fingerprint: str, tokens: TokenText, want_logprobs: bool
    ):
        super().__init__(request_id, model, fingerprint, tokens, want_logprobs)
        self._offset = 0  # text_offset of the next token, from the start of the completion

    def _logprobs(self, logprobs: Sequence[TokenLogprobs]) -> r.CompletionLogprobs | None:
        if not self._want_logprobs:
            return None
        out = r.CompletionLogprobs(tokens=[], token_logprobs=[], top_logprobs=[], text_offset=[])
        for lp in logprobs:
            text = self._tokens(lp.token_id)
            out.tokens.append(text)
            out.token_logprobs.append(lp.logprob)
            out.top_logprobs.append({self._tokens(t): v for t, v in lp.top})
            out.text_offset.append(self._offset)
            self._offset += len(text)
        return out

    def opening(self) -> list[str]:
        return []

    def delta(self, text: str, logprobs: Sequence[TokenLogprobs]) -> str | None:
        if not text and not (self._want_logprobs and logprobs):
            return None
        return self._chunk([r.CompletionChoice(text=text, logprobs=self._logprobs(logprobs))])

    def final(self, out: RequestOutput) -> str:
        choice = r.CompletionChoice(
            text="", finish_reason=out.finish_reason, truncated=out.truncated
        )
        return self._chunk([choice], timings=timings_of(out))

    def response(
        self, text: str, logprobs: Sequence[TokenLogprobs], out: RequestOutput
    ) -> r.Completion:
        choice = r.CompletionChoice(
            text=text,
            logprobs=self._logprobs(logprobs),
            finish_reason=out.finish_reason or "stop",
            truncated=out.truncated,
        )
        return self._body(r.Completion, [choice], usage=usage_of(out), timings=timings_of(out))


class OpenAIResponse:
    """A chat or completion `Format` as server/respond.py's `ResponseFormat`: SSE `data:` events
    ending with `[DONE]` (a usage chunk first with `stream_options.include_usage`)."""

    def __init__(self, fmt: Format, include_usage: bool):
        self._fmt = fmt
        self._include_usage = include_usage

    def opening(self, first) -> list[str]:
        return [data_event(o) for o in self._fmt.opening()]

    def delta(self, out: RequestOutput) -> list[str]:
        delta = self._fmt.delta(out.new_text, out.new_logprobs)
        return [] if delta is None else [data_event(delta)]

    def closing(self, final: RequestOutput) -> list[str]:
        usage = [data_event(self._fmt.usage(final))] if self._include_usage else []
        return [data_event(self._fmt.final(final)), *usage, DONE]

    def error(self, error: BaseException) -> list[str]:
        return [data_event({"error": error_body(error)}), DONE]

    def keepalive(self, admitted: bool) -> str:
        return comment("working" if admitted else "waiting")

    def whole(self, got: Collected) -> dict:
        return self._fmt.response(got.text, got.logprobs, got.final).model_dump(mode="json", exclude_none=False)
