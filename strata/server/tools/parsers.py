"""Tool calls read out of a model's answer, for the formats the supported families write:

- `hermes` (Qwen2/2.5/3, Hermes, SmolLM-style ChatML templates): each call is
  `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, text may come around them;
- `llama3_json` (Llama 3.1-3.3): the answer is `{"name": ..., "parameters": {...}}` (several
  joined by ";"), or such JSON after `<|python_tag|>`;
- `mistral`: `[TOOL_CALLS]` then a JSON list of `{"name", "arguments"}`, or (newer
  tokenizers) `[TOOL_CALLS]name[ARGS]{...}` once per call.

`ToolCallParser` reads an answer as it streams: text leaves as content at once, except what
may be the start of a call (a prefix of the format's marker; for llama3_json an answer that
begins with "{"), which is held until it is decided. A call region that does not parse (bad
JSON, no name) is given back as content, as the model wrote it; one cut off by the end of
the answer is a call if what came parses, content otherwise.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from strata.server.tools.calls import ToolCall, call_from_object, calls_from_json

Piece = str | ToolCall  # content text, or one whole call


@dataclass(frozen=True)
class ToolFormat:
    name: str
    start: str  # the marker that opens a call region
    end: str | None  # the marker that closes it; None: the region runs to the end of the answer
    parse: Callable[[str], list[ToolCall] | None]
    bare_json: bool = False  # an answer starting with "{" may be a call (Llama 3's JSON calls)
    special_markers: bool = False  # the markers are special tokens: the answer's text must keep them


def _hermes(region: str) -> list[ToolCall] | None:
    return calls_from_json(region.strip(), ("arguments", "parameters"))


def _llama3(region: str) -> list[ToolCall] | None:
    text = region.strip()
    found = calls_from_json(text, ("parameters", "arguments"))
    if found is not None:
        return found
    calls: list[ToolCall] = []
    for part in text.split(";"):
        one = calls_from_json(part.strip(), ("parameters", "arguments"))
        if one is None:
            return None
        calls += one
    return calls or None


def _mistral(region: str) -> list[ToolCall] | None:
    calls: list[ToolCall] = []
    for part in (p.strip() for p in region.split("[TOOL_CALLS]")):
        if not part:
            continue
        if "[ARGS]" in part:
            name, _, args = part.partition("[ARGS]")
            try:
                value = json.loads(args)
            except ValueError:
                return None
            call = call_from_object({"name": name.strip(), "arguments": value})
            if call is None:
                return None
            calls.append(call)
            continue
        found = calls_from_json(part, ("arguments", "parameters"))
        if found is None:
            return None
        calls += found
    return calls or None


FORMATS = {
    "hermes": ToolFormat("hermes", "<tool_call>", "</tool_call>", _hermes),
    "llama3_json": ToolFormat("llama3_json", "<|python_tag|>", None, _llama3, bare_json=True,
                              special_markers=True),
    "mistral": ToolFormat("mistral", "[TOOL_CALLS]", None, _mistral, special_markers=True),
}


def format_for_template(template: str | None) -> ToolFormat:
    """The format a chat template's family writes (Hermes's when it names none)."""
    source = template or ""
    if "[TOOL_CALLS]" in source:
        return FORMATS["mistral"]
    if "<|python_tag|>" in source or ("<|start_header_id|>" in source and "<tool_call>" not in source):
        return FORMATS["llama3_json"]
    return FORMATS["hermes"]


class ToolCallParser:
    """One answer's tool calls and content, fed as its text streams (`feed`, then `finish`)."""

    def __init__(self, fmt: ToolFormat):
        self.fmt = fmt
        self._buf = ""
        self._region: str | None = None  # inside a call region: its text so far
        self._bare = False  # the region is a bare JSON answer (no start marker)
        self._decided = not fmt.bare_json  # whether the answer's start can still be a bare call
        # Whitespace held back: a run of it between calls (or between a call and an end) is dropped,
        # whitespace in a stretch of text that has words is kept as the model wrote it
        self._spaces = ""
        self._has_text = False  # the stretch of text since the last call has non-whitespace
        self.num_calls = 0

    def feed(self, text: str) -> list[Piece]:
        self._buf += text
        out: list[Piece] = []
        while self._buf:
            if self._region is not None:
                if not self._take_region(out):
                    break
                continue
            if not self._decided:
                head = self._buf.lstrip()
                if not head:
                    break  # only whitespace so far: the answer may still be a bare call
                self._decided = True
                if head.startswith("{"):
                    self._region, self._bare, self._buf = "", True, head
                    continue
            i = self._buf.find(self.fmt.start)
            if i >= 0:
                self._content(out, self._buf[:i])
                self._buf = self._buf[i + len(self.fmt.start):]
                self._region = ""
                continue
            keep = _partial_suffix(self._buf, self.fmt.start)
            self._content(out, self._buf[: len(self._buf) - keep])
            self._buf = self._buf[len(self._buf) - keep:]
            break
        return out

    def finish(self) -> list[Piece]:
        out: list[Piece] = []
        if self._region is not None:
            self._region += self._buf
            self._buf = ""
            self._close(out, complete=False)
        elif self._buf:
            self._content(out, self._buf)
            self._buf = ""
        if self._spaces and (self._has_text or not self.num_calls):
            out.append(self._spaces)
        self._spaces = ""
        return out

    def _take_region(self, out: list[Piece]) -> bool:
        """Moves text into the open region; True when it closed (more text may follow)."""
        assert self._region is not None
        self._region += self._buf
        self._buf = ""
        if self._bare or self.fmt.end is None:
            return False
        j = self._region.find(self.fmt.end)
        if j < 0:
            return False
        self._buf = self._region[j + len(self.fmt.end):]
        self._region = self._region[:j]
        self._close(out, complete=True)
        return True

    def _close(self, out: list[Piece], complete: bool) -> None:
        region, self._region = self._region or "", None
        calls = self.fmt.parse(region)
        if calls:
            if self._spaces and self._has_text:
                out.append(self._spaces)
            self._spaces, self._has_text = "", False
            self.num_calls += len(calls)
            out.extend(calls)
        elif self._bare:
            self._content(out, region)
        else:
            self._content(out, self.fmt.start + region + ((self.fmt.end or "") if complete else ""))
        self._bare = False

    def _content(self, out: list[Piece], text: str) -> None:
        if not text:
            return
        if not text.strip():
            self._spaces += text
            return
        out.append(self._spaces + text)
        self._spaces, self._has_text = "", True


def _partial_suffix(text: str, marker: str) -> int:
    """The length of the longest suffix of `text` that is a proper prefix of `marker`."""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


def parse_all(fmt: ToolFormat, text: str) -> tuple[str, list[ToolCall]]:
    """A whole answer: its content (the text outside calls) and its calls."""
    parser = ToolCallParser(fmt)
    pieces = parser.feed(text) + parser.finish()
    content = "".join(p for p in pieces if isinstance(p, str))
    return content, [p for p in pieces if isinstance(p, ToolCall)]
