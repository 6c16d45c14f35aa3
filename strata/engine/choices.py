"""n choices of one prompt: the first is prefilled; the others wait here until its prompt's
K/V is written (it has a token) or it ended, then go to the scheduler, whose admission forks
the first's cached prompt (full chunks shared, the partial last one copied)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from strata.engine.request import RequestState


class HeldChoices:
    def __init__(self) -> None:
        self._held: dict[str, list[str]] = {}  # first choice -> the choices waiting to fork it

    def __bool__(self) -> bool:
        return bool(self._held)

    def hold(self, first: str, rest: Sequence[str]) -> None:
        if rest:
            self._held[first] = list(rest)

    def release(self, requests: Mapping[str, RequestState], add: Callable[[str, list[int], int], None]) -> None:
        """`add(request_id, prompt_ids, max_tokens)` every held choice whose first choice has a
        token or ended; a held choice cancelled meanwhile is not in `requests` and is skipped."""
        for first, rest in list(self._held.items()):
            state = requests.get(first)
            if state is not None and not state.output_ids:
                continue
            del self._held[first]
            for rid in rest:
                if rid in requests:
                    held = requests[rid]
                    add(rid, held.prompt_ids, held.params.max_tokens)
