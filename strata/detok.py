"""Streaming detokenization with stop strings: `IncrementalDetokenizer`.

Text passes two gates before it is emitted:

1. Stable text. Byte-level BPE tokens can end inside a multi-byte UTF-8 character,
   which decodes to U+FFFD until the following token completes it. Each step decodes
   only a window of token ids, from `prefix_offset` (the start of the last stretch of
   stable ids that decoded to some text, kept as context for tokenizers whose decode
   depends on the neighbour, e.g. SentencePiece dropping the leading space of what it
   decodes) to the end, and takes the part beyond the stable boundary (`read_offset`).
   A trailing run of U+FFFD is held back; the text before it is stable (later bytes
   cannot change a completed character). When the new part has no trailing U+FFFD the
   boundary moves to the end. So the cost per token is two decodes of a few ids, not of
   the whole output (the window only grows while output keeps ending in invalid UTF-8,
   which `finish()` flushes as U+FFFD, or while new ids decode to no text).
   SentencePiece byte pieces (`<0xNN>`, the tokenizer's `byte_piece_ids`) decode as one
   group per run, and a run that turns out invalid decodes wholly to U+FFFD, even the
   characters it completed before. So the text of a run still open at the end (the
   last ids are byte pieces, or special tokens that decoding skips) is held back until
   a piece of another kind closes it, and only the text before the run is stable.
   `context` (the prompt's last ids) starts the window: the output is decoded as the
   continuation of the prompt, so SentencePiece keeps its first token's leading space.

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
matched) equal `decode(context + ids)` past `decode(context)` (`decode(ids)` without a
context), cut where the first stop string to complete starts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from strata.stop_match import StopMatcher

REPLACEMENT_CHAR = "\ufffd"
CONTEXT_IDS = 4  # prompt ids kept as decoding context


class Decoder(Protocol):
    """What the detokenizer needs. A tokenizer with SentencePiece byte pieces also has
    `byte_piece_ids` (a frozenset) and `is_special(id)`; one without them need not."""

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
        context: Sequence[int] = (),
    ):
        if isinstance(stop, str):
            raise TypeError("stop must be a tuple or list of strings, not a str")
        if any(not s for s in stop):
            raise ValueError("stop strings must not be empty")
        self._tokenizer = tokenizer
        self._stop = tuple(stop)
        self._skip_special_tokens = skip_special_tokens
        self._byte_ids: frozenset[int] = getattr(tokenizer, "byte_piece_ids", frozenset())
        self._is_special = getattr(tokenizer, "is_special", lambda _: False)
        self._ids: list[int] = self._context(context)
        # Invariant: ids[:read_offset] decode to a stable prefix whose text has been
        # moved past gate 1 (the context's counts as moved); prefix_offset <= read_offset
        # is the window's start.
        self._prefix_offset = 0
        self._read_offset = len(self._ids)
        self._prefix_text = self._decode(self._ids)  # decode(ids[prefix_offset:read_offset])
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
        run = self._open_run()
        if run:
            # A byte-piece run may still turn invalid: only the text before it is stable.
            stable = self._decode(self._ids[self._prefix_offset : len(self._ids) - run])
            stable = stable[len(self._prefix_text) :].rstrip(REPLACEMENT_CHAR)
            self._held += stable[self._taken :]
            self._taken = max(self._taken, len(stable))
        elif fresh.endswith(REPLACEMENT_CHAR):
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

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip_special_tokens)

    def _decode_fresh(self) -> str:
        """Text of ids[read_offset:], decoded with the context of the window."""
        return self._decode(self._ids[self._prefix_offset :])[len(self._prefix_text) :]

    def _context(self, context: Sequence[int]) -> list[int]:
        """The prompt's last ids that start the window: none when they end inside a
        character or a byte-piece run (the output would change their text)."""
        ids = list(context[-CONTEXT_IDS:])
        if ids and (ids[-1] in self._byte_ids or self._decode(ids).endswith(REPLACEMENT_CHAR)):
            return []
        return ids

    def _open_run(self) -> int:
        """How many of the last ids (after read_offset) form a byte-piece run still open."""
        if not self._byte_ids:
            return 0
        n, has_bytes = 0, False
        for token_id in reversed(self._ids[self._read_offset :]):
            if token_id in self._byte_ids:
                has_bytes = True
            elif not (self._skip_special_tokens and self._is_special(token_id)):
                break
            n += 1
        return n if has_bytes else 0

    def _advance(self) -> None:
        """Everything added so far is stable: move the window's boundary to the end. The
        window's start moves only past ids that decode to some text of their own, so the
        decoder always sees what came before the new ids (e.g. whether a space leads)."""
        stretch = self._decode(self._ids[self._read_offset :])
        if stretch:
            self._prefix_offset, self._prefix_text = self._read_offset, stretch
        else:
            self._prefix_text = self._decode(self._ids[self._prefix_offset :])
        self._read_offset = len(self._ids)
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
