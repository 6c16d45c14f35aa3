"""A reasoning model's thinking split from its answer: `<think>...</think>` (or the markers its
chat template uses) at the start of the answer becomes `reasoning_content` (OpenAI-compatible,
as vLLM and llama.cpp send it) and Anthropic `thinking` blocks; the rest is the answer.

The block counts only at the start of the answer (after whitespace), or from the first token
when the prompt itself opened it (templates that end the generation prompt with `<think>`).
A block the answer never closes is all reasoning. Text that may be a marker's start is held
until it is decided.
"""

from __future__ import annotations

from dataclasses import dataclass

# (opening, closing) markers, the most specific first
MARKERS = (("<|START_THINKING|>", "<|END_THINKING|>"), ("[THINK]", "[/THINK]"), ("<thinking>", "</thinking>"),
           ("<think>", "</think>"))


@dataclass(frozen=True)
class Reasoning:
    opening: str
    closing: str
    inside: bool  # the prompt ends inside an opened block


def reasoning_for(template: str | None, prompt_text: str) -> Reasoning:
    """The markers `template` uses (`<think>` when it names none); `inside` when `prompt_text`
    ends with the opening marker."""
    opening, closing = next(((o, c) for o, c in MARKERS if o in (template or "")), MARKERS[-1])
    return Reasoning(opening, closing, prompt_text.rstrip().endswith(opening))


class ReasoningSplitter:
    """Feeds text; returns ("reasoning" | "content", text) pieces in order."""

    def __init__(self, spec: Reasoning):
        self.spec = spec
        self._state = "inside" if spec.inside else "start"  # start | inside | after
        self._buf = ""
        self._after_close = False  # newlines right after the closing marker are dropped

    def feed(self, text: str) -> list[tuple[str, str]]:
        self._buf += text
        out: list[tuple[str, str]] = []
        if self._state == "start":
            head = self._buf.lstrip()
            opening = self.spec.opening
            if head.startswith(opening):
                self._buf, self._state = head[len(opening):], "inside"
            elif len(head) < len(opening) and opening.startswith(head):
                return out  # may still be the opening marker
            else:
                self._state = "after"
        if self._state == "inside":
            j = self._buf.find(self.spec.closing)
            if j >= 0:
                if j:
                    out.append(("reasoning", self._buf[:j]))
                self._buf, self._state = self._buf[j + len(self.spec.closing):], "after"
                self._after_close = True
            else:
                keep = _partial_suffix(self._buf, self.spec.closing)
                if len(self._buf) > keep:
                    out.append(("reasoning", self._buf[: len(self._buf) - keep]))
                self._buf = self._buf[len(self._buf) - keep:]
                return out
        if self._state == "after" and self._after_close:
            self._buf = self._buf.lstrip("\n")
            self._after_close = not self._buf
        if self._state == "after" and self._buf:
            out.append(("content", self._buf))
            self._buf = ""
        return out

    def finish(self) -> list[tuple[str, str]]:
        text, self._buf = self._buf, ""
        if not text:
            return []
        return [("reasoning" if self._state == "inside" else "content", text)]


def _partial_suffix(text: str, marker: str) -> int:
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0
