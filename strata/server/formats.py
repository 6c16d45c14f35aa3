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


def usage_of(finals: RequestOutput | Sequence[RequestOutput]) -> r.Usage:
    """Usage of one answer, or of n choices of one prompt (the prompt counted once)."""
    finals = [finals] if isinstance(finals, RequestOutput) else list(finals)
    prompt = finals[0].num_prompt_tokens
    output = sum(f.num_output_tokens for f in finals)
    return r.Usage(
        prompt_tokens=prompt,
        completion_tokens=output,
        total_tokens=prompt + output,
        prompt_tokens_details=r.PromptTokensDetails(cached_tokens=finals[0].num_cached_tokens),
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
    def delta(self, out: RequestOutput, index: int = 0) -> list[str]: ...
    def final(self, out: RequestOutput, index: int = 0) -> str: ...
    def usage(self, finals: Sequence[RequestOutput]) -> str: ...
    def response(self, gots: Sequence[Collected]) -> r.ChatCompletion | r.Completion: ...


class Stream:
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

    def usage(self, finals: Sequence[RequestOutput]) -> str:
        return self._chunk([], usage=usage_of(finals))


class CompletionFormat(Stream):
    id_prefix, chunk_type = "cmpl", r.Completion

    def __init__(self, request_id: str, model: str, fingerprint: str, tokens: TokenText, want_logprobs: bool,
                 n: int = 1):
        super().__init__(request_id, model, fingerprint, tokens, want_logprobs)
        self._offsets = [0] * n  # per choice: text_offset of the next token, from the completion's start

    def _logprobs(self, logprobs: Sequence[TokenLogprobs], index: int = 0) -> r.CompletionLogprobs | None:
        if not self._want_logprobs:
            return None
        out = r.CompletionLogprobs(tokens=[], token_logprobs=[], top_logprobs=[], text_offset=[])
        for lp in logprobs:
            text = self._tokens(lp.token_id)
            out.tokens.append(text)
            out.token_logprobs.append(lp.logprob)
            out.top_logprobs.append({self._tokens(t): v for t, v in lp.top})
            out.text_offset.append(self._offsets[index])
            self._offsets[index] += len(text)
        return out

    def opening(self) -> list[str]:
        return []

    def delta(self, out: RequestOutput, index: int = 0) -> list[str]:
        text, logprobs = out.new_text, out.new_logprobs
        if not text and not (self._want_logprobs and logprobs):
            return []
        return [self._chunk([r.CompletionChoice(index=index, text=text, logprobs=self._logprobs(logprobs, index))])]

    def final(self, out: RequestOutput, index: int = 0) -> str:
        choice = r.CompletionChoice(
            index=index, text="", finish_reason=out.finish_reason, truncated=out.truncated
        )
        return self._chunk([choice], timings=timings_of(out))

    def response(self, gots: Sequence[Collected]) -> r.Completion:
        choices = [
            r.CompletionChoice(
                index=i,
                text=got.text,
                logprobs=self._logprobs(got.logprobs, i),
                finish_reason=got.final.finish_reason or "stop",
                truncated=got.final.truncated,
            )
            for i, got in enumerate(gots)
        ]
        finals = [g.final for g in gots]
        return self._body(r.Completion, choices, usage=usage_of(finals), timings=timings_of(finals[0]))


class OpenAIResponse:
    """A chat or completion `Format` as server/respond.py's `ResponseFormat`: SSE `data:` events
    ending with `[DONE]` (a usage chunk first with `stream_options.include_usage`)."""

    def __init__(self, fmt: Format, include_usage: bool):
        self._fmt = fmt
        self._include_usage = include_usage

    def opening(self, first) -> list[str]:
        return [data_event(o) for o in self._fmt.opening()]

    def delta(self, out: RequestOutput, index: int = 0) -> list[str]:
        return [data_event(d) for d in self._fmt.delta(out, index)]

    def closing(self, final: RequestOutput, index: int = 0) -> list[str]:
        return [data_event(self._fmt.final(final, index))]

    def done(self, finals: Sequence[RequestOutput]) -> list[str]:
        usage = [data_event(self._fmt.usage(finals))] if self._include_usage else []
        return [*usage, DONE]

    def error(self, error: BaseException) -> list[str]:
        return [data_event({"error": error_body(error)}), DONE]

    def keepalive(self, admitted: bool) -> str:
        return comment("working" if admitted else "waiting")

    def whole(self, gots: Sequence[Collected]) -> dict:
        return self._fmt.response(gots).model_dump(mode="json", exclude_none=False)
