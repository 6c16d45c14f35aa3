"""Stop strings found in text that arrives piece by piece: `StopMatcher`.

One Knuth-Morris-Pratt automaton per stop string. Invariant, after each `feed`: `state[k]`
is the length of the longest suffix of all the text fed so far that is a proper prefix of
stop string k. So each character costs amortised O(1) per stop string, whatever the
stop strings' lengths and however the text was split, and `pending` (the text that may
still become a stop string) is known without searching. While no stop string has begun
(every state 0), a regex jumps to the next character that starts one, so ordinary text
is skipped at C speed.
"""

from __future__ import annotations

import re


def _failure(pattern: str) -> list[int]:
    """fail[i]: the longest proper prefix of pattern[: i + 1] that is also its suffix."""
    fail = [0] * len(pattern)
    k = 0
    for i in range(1, len(pattern)):
        while k and pattern[i] != pattern[k]:
            k = fail[k - 1]
        if pattern[i] == pattern[k]:
            k += 1
        fail[i] = k
    return fail


class StopMatcher:
    def __init__(self, stops: tuple[str, ...]):
        if any(not s for s in stops):
            raise ValueError("stop strings must not be empty")
        self._stops = stops
        self._fail = [_failure(s) for s in stops]
        self._state = [0] * len(stops)
        firsts = "".join(sorted({re.escape(stop[0]) for stop in stops}))
        self._starts = re.compile(f"[{firsts}]") if stops else None

    @property
    def pending(self) -> int:
        """Length of the longest suffix of the text fed so far that is a proper prefix of a
        stop string: text that must be held back until more text decides."""
        return max(self._state, default=0)

    def feed(self, text: str) -> tuple[int, int] | None:
        """Feed `text`. When a stop string completes in it, return `(end, length)`: the first
        completion (`text[:end]` ends with it), the longest stop string on a tie; the
        matcher is then spent (a stop ends the output). Else None."""
        if self._starts is None:
            return None
        stops, fail, state = self._stops, self._fail, self._state
        pos, size = 0, len(text)
        while pos < size:
            if not any(state):  # nothing begun: only a stop's first character matters
                found = self._starts.search(text, pos)
                if found is None:
                    return None
                pos = found.start()
            char = text[pos]
            pos += 1
            done = 0
            for k, stop in enumerate(stops):
                s = state[k]
                while s and stop[s] != char:
                    s = fail[k][s - 1]
                if stop[s] == char:
                    s += 1
                if s == len(stop):
                    done = max(done, s)
                    s = fail[k][s - 1]
                state[k] = s
            if done:
                return pos, done
        return None
