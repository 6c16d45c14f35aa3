"""One answer's text read into its parts as it streams: reasoning (strata/server/reasoning.py),
content, and tool calls (strata/server/tools/parsers.py), in the order the model wrote them.
The reasoning block is split off first; the tool parser reads what remains."""

from __future__ import annotations

from dataclasses import dataclass, field

from strata.server.reasoning import Reasoning, ReasoningSplitter
from strata.server.tools.calls import ToolCall
from strata.server.tools.parsers import ToolCallParser, ToolFormat


@dataclass(frozen=True)
class AnswerShape:
    """How to read a request's answers: None fields are not read for."""

    reasoning: Reasoning | None = None
    tools: ToolFormat | None = None
    parallel: bool = True  # without parallel_tool_calls only the first call is kept

    def reader(self) -> AnswerReader:
        return AnswerReader(self)


@dataclass
class Parts:
    reasoning: list[str] = field(default_factory=list)
    content: list[str] = field(default_factory=list)
    calls: list[ToolCall] = field(default_factory=list)


class AnswerReader:
    def __init__(self, shape: AnswerShape):
        self.shape = shape
        self._reasoning = ReasoningSplitter(shape.reasoning) if shape.reasoning is not None else None
        self._tools = ToolCallParser(shape.tools) if shape.tools is not None else None
        self.num_calls = 0

    def feed(self, text: str) -> Parts:
        return self._read(text, final=False)

    def finish(self) -> Parts:
        return self._read("", final=True)

    def _read(self, text: str, final: bool) -> Parts:
        parts = Parts()
        pieces = [("content", text)] if self._reasoning is None else self._reasoning.feed(text)
        if final and self._reasoning is not None:
            pieces += self._reasoning.finish()
        content = []
        for kind, piece in pieces:
            if kind == "reasoning":
                parts.reasoning.append(piece)
            else:
                content.append(piece)
        if self._tools is None:
            parts.content += [c for c in content if c]
            return parts
        found = [p for c in content for p in self._tools.feed(c)]
        if final:
            found += self._tools.finish()
        for p in found:
            if isinstance(p, ToolCall):
                if self.shape.parallel or self.num_calls == 0:
                    parts.calls.append(p)
                    self.num_calls += 1
            else:
                parts.content.append(p)
        return parts


def read_whole(shape: AnswerShape, text: str) -> Parts:
    reader = shape.reader()
    first, last = reader.feed(text), reader.finish()
    return Parts(first.reasoning + last.reasoning, first.content + last.content, first.calls + last.calls)
