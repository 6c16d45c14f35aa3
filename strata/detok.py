"""Streaming detokenization with stop strings: `IncrementalDetokenizer`.

Text passes two gates before it is emitted:

1. Stable text. Byte-level BPE tokens can end inside a multi-byte UTF-8 character,
   which decodes to U+FFFD until the following token completes it. Each step decodes
   only a window of token ids, from `prefix_offset` (the token before the last stable
   boundary, kept as context for tokenizers whose decode depends on the neighbour,
   e.g. SentencePiece's leading space) to the end, and takes the part beyond the
   stable boundary (`read_offset`). A trailing run of U+FFFD is held back; the text
   before it is stable (later bytes cannot change a completed character). When the
   new part has no trailing U+FFFD the boundary moves to the end. So the cost per
   token is two decodes of a few ids, not of the whole output (the window only grows
   while output keeps ending in invalid UTF-8, which `finish()` flushes as U+FFFD).

2. Stop strings. Stop strings are searched across the whole output, so a stop string
   can span any number of tokens. Stable text that has not been emitted (`_held`) is
   searched; an occurrence cannot start in text already emitted, because emitted text
   never includes a suffix that is a prefix of a stop string (the longest such suffix
   is held back until the next text shows it is not a stop). On a match, the stop
   string and everything after it are dropped and `is_stopped` becomes True. The stop
   string that completes first wins (the occurrence that ends first in the text; on a
   tie the longer one), as if the text arrived one character at a time, so the result
   does not depend on how the text was split into tokens. Matching is on decoded text, so with `skip_special_tokens`
   a skipped special token is invisible to stop strings. Each character is matched once,
   as it arrives (`StopMatcher`, KMP automata): the work per token does not grow with
   the stop strings' length or with the text held back.

Guarantees: a delta never ends inside a UTF-8 character; no delta holds text at or
after a stop string's start; concatenated deltas (plus `finish()` when no stop
matched) equal `decode(all ids)` cut where the first stop string to complete starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from strata.stop_match import StopMatcher

REPLACEMENT_CHAR = "\ufffd"


class Decoder(Protocol):
    def decode(self, ids: list[int], skip_special_tokens: bool) -> str: ...


@dataclass(frozen=True)
class Delta:
    text: str  # safe to emit now; may be empty
    is_stopped: bool  # a stop string completed; no more text will come


class IncrementalDetokenizer:
    def __init__(
        self,
        tokenizer: Decoder,
        stop: tuple[str, ...] | list[str] = (),
        skip_special_tokens: bool = True,
    ):
        if isinstance(stop, str):
            raise TypeError("stop must be a tuple or list of strings, not a str")
        if any(not s for s in stop):
            raise ValueError("stop strings must not be empty")
        self._tokenizer = tokenizer
        self._stop = tuple(stop)
        self._skip_special_tokens = skip_special_tokens
        self._ids: list[int] = []
        # Invariant: ids[:read_offset] decode to a stable prefix whose text has been
        # moved past gate 1; prefix_offset <= read_offset is the window's start.
        self._prefix_offset = 0
        self._read_offset = 0
        self._prefix_text = ""  # decode(ids[prefix_offset:read_offset]), cached
        self._taken = 0  # chars of the text beyond read_offset already moved to _held
        self._held = ""  # stable text not yet emitted (a possible stop string start)
        # Invariant: _held[:_fed] has been fed to _matcher, and len(_held) >= _matcher.pending
        # after every release (the held text covers any stop string that may be starting).
        self._matcher = StopMatcher(self._stop)
        self._fed = 0
        self._emitted: list[str] = []
        self._stopped = False
        self._stop_string: str | None = None  # the stop string that matched, once stopped
        self._finished = False

    @property
    def text(self) -> str:
        """All text emitted so far (deltas and `finish()`)."""
        if len(self._emitted) > 1:
            self._emitted = ["".join(self._emitted)]  # join once, not on every call
        return self._emitted[0] if self._emitted else ""

    @property
    def is_stopped(self) -> bool:
        return self._stopped

    @property
    def stop_string(self) -> str | None:
        """Which stop string ended the output (None until one matched)."""
        return self._stop_string

    def add(self, token_id: int) -> Delta:
        """Take one generated token; return the text that is now safe to emit.

        After a stop string matched, further tokens are ignored (empty deltas).
        """
        if self._finished:
            raise RuntimeError("add() after finish()")
        if self._stopped:
            return Delta("", True)
        self._ids.append(token_id)
        fresh = self._decode_fresh()
        if fresh.endswith(REPLACEMENT_CHAR):
            # Maybe an unfinished character: keep it (and its run) back.
            stable = fresh.rstrip(REPLACEMENT_CHAR)
            self._held += stable[self._taken :]
            self._taken = max(self._taken, len(stable))
        else:
            self._held += fresh[self._taken :]
            self._advance()
        return Delta(self._release(final=False), self._stopped)

    def finish(self) -> str:
        """The end of the output: flush what was held back (all of it, unless a stop
        string matches in it; then `is_stopped` turns True). Empty after a stop."""
        if self._finished:
            raise RuntimeError("finish() called twice")
        self._finished = True
        if self._stopped:
            return ""
        self._held += self._decode_fresh()[self._taken :]
        self._advance()
        return self._release(final=True)

    def _decode_fresh(self) -> str:
        """Text of ids[read_offset:], decoded with the context of the window."""
        window = self._ids[self._prefix_offset :]
        text = self._tokenizer.decode(window, skip_special_tokens=self._skip_special_tokens)
        return text[len(self._prefix_text) :]

    def _advance(self) -> None:
        """Everything added so far is stable: move the window's boundary to the end."""
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        window = self._ids[self._prefix_offset : self._read_offset]
        self._prefix_text = self._tokenizer.decode(
            window, skip_special_tokens=self._skip_special_tokens
        )
        self._taken = 0

    def _release(self, final: bool) -> str:
        """Emit the held text up to the first stop string or the possible start of one."""
        held = self._held
        # The first stop string to complete: the occurrence that ends first; on a tie,
        # the longer one (it starts first).
        hit = self._matcher.feed(held[self._fed :])
        if hit is not None:
            end, length = hit
            cut = self._fed + end - length
            self._stopped = True
            self._stop_string = held[cut : cut + length]
            self._held = ""
        elif final:
            cut = len(held)
            self._held = ""
        else:
            cut = len(held) - self._matcher.pending
            self._held = held[cut:]
        self._fed = len(self._held)
        out = held[:cut]
        if out:
            self._emitted.append(out)
        return out
