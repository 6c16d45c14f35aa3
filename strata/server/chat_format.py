"""Engine outputs -> OpenAI chat bodies: each choice's answer read into reasoning_content,
content and tool_calls (strata/server/answer.py), whole or as stream deltas.

Streamed tool calls follow OpenAI's shape: a call's first delta carries its index, id, type
and name with empty arguments, the next its arguments; `finish_reason` is "tool_calls" when
the answer made calls and ended on its own."""

from __future__ import annotations

from collections.abc import Sequence

from strata.engine.interface import Collected, RequestOutput
from strata.sampler import TokenLogprobs
from strata.server import responses as r
from strata.server.answer import AnswerReader, AnswerShape, Parts, read_whole
from strata.server.formats import Stream, TokenText, timings_of, usage_of
from strata.server.tools.calls import ToolCall


def finish_reason(out: RequestOutput, num_calls: int) -> str:
    reason = out.finish_reason or "stop"
    return "tool_calls" if num_calls and reason == "stop" else reason


class ChatFormat(Stream):
    id_prefix, chunk_type = "chatcmpl", r.ChatCompletionChunk

    def __init__(self, request_id: str, model: str, fingerprint: str, tokens: TokenText, want_logprobs: bool,
                 shape: AnswerShape = AnswerShape(), n: int = 1):
        super().__init__(request_id, model, fingerprint, tokens, want_logprobs)
        self._shape = shape
        self._readers: list[AnswerReader] = [shape.reader() for _ in range(n)]
        self._n = n

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
        return [self._chunk([r.ChatChunkChoice(index=i, delta=r.ChatDelta(role="assistant", content=""))])
                for i in range(self._n)]

    def delta(self, out: RequestOutput, index: int = 0) -> list[str]:
        reader = self._readers[index]
        first_call = reader.num_calls
        parts = reader.feed(out.new_text)
        if out.finished:
            last = reader.finish()
            parts = Parts(parts.reasoning + last.reasoning, parts.content + last.content, parts.calls + last.calls)
        chunks = []
        reasoning, content = "".join(parts.reasoning), "".join(parts.content)
        lps = out.new_logprobs if self._want_logprobs else ()
        if reasoning or content or lps:
            delta = r.ChatDelta(content=content or None, reasoning_content=reasoning or None)
            if not (reasoning or content):
                delta = r.ChatDelta(content="")
            chunks.append(self._chunk([r.ChatChunkChoice(index=index, delta=delta, logprobs=self._logprobs(lps))]))
        for k, call in enumerate(parts.calls):
            chunks += self._call_chunks(index, first_call + k, call)
        return chunks

    def _call_chunks(self, index: int, call_index: int, call: ToolCall) -> list[str]:
        head = r.ToolCallDelta(index=call_index, id=call.id, type="function",
                               function=r.FunctionCallDelta(name=call.name, arguments=""))
        body = r.ToolCallDelta(index=call_index, function=r.FunctionCallDelta(arguments=call.arguments))
        return [self._chunk([r.ChatChunkChoice(index=index, delta=r.ChatDelta(tool_calls=[d]))]) for d in (head, body)]

    def final(self, out: RequestOutput, index: int = 0) -> str:
        choice = r.ChatChunkChoice(index=index, delta=r.ChatDelta(),
                                   finish_reason=finish_reason(out, self._readers[index].num_calls),
                                   truncated=out.truncated)
        return self._chunk([choice], timings=timings_of(out))

    def message(self, parts: Parts) -> r.AssistantMessage:
        content = "".join(parts.content)
        calls = [r.ToolCallOut(id=c.id, function=r.FunctionCall(name=c.name, arguments=c.arguments))
                 for c in parts.calls]
        reasoning = "".join(parts.reasoning)
        return r.AssistantMessage(content=None if calls and not content.strip() else content,
                                  reasoning_content=reasoning or None, tool_calls=calls or None)

    def response(self, gots: Sequence[Collected]) -> r.ChatCompletion:
        choices = []
        for i, got in enumerate(gots):
            parts = read_whole(self._shape, got.text)
            out = got.final
            choices.append(r.ChatChoice(index=i, message=self.message(parts), logprobs=self._logprobs(got.logprobs),
                                        finish_reason=finish_reason(out, len(parts.calls)), truncated=out.truncated))
        finals = [g.final for g in gots]
        return self._body(r.ChatCompletion, choices, usage=usage_of(finals), timings=timings_of(finals[0]))
